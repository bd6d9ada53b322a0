"""What the READMEs tell a user to run about this package: installing it from this source tree
or its wheel (the ``wsync`` project on PyPI is an unrelated package), with the wheel named for
the version in ``pyproject.toml``; and the strategy list not calling an existing kind future."""

import re

import pytest

from conftest import PACKAGE_ROOT, REPO_ROOT

READMES = [REPO_ROOT / "README.md", PACKAGE_ROOT / "README.md"]

#: ``pip install`` of a requirement named ``wsync`` (with or without extras or a version), i.e.
#: from a package index: ``pip install wsync``, ``pip install "wsync[vllm]"``, ``wsync==0.5.0``.
#: A path (``./bindings/python``, ``dist/wsync-...whl``) is not a bare name.
PYPI_INSTALL = re.compile(r"pip3?\s+install\b[^\n`]*?(?<![\w./-])[\"']?wsync(?:\[[^\]]*\])?(?:[=<>~!]=?[\w.]*)?[\"']?(?=\s|`|$)",
                          re.MULTILINE)


def _readme(path):
    if not path.is_file():
        pytest.skip(f"{path} is not in this checkout")
    return path.read_text(encoding="utf-8")


def _version():
    text = (PACKAGE_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    return re.search(r'^version = "([^"]+)"', text, re.MULTILINE).group(1)


def test_the_pattern_catches_pypi_installs_and_not_local_ones():
    for bad in ('pip install wsync', 'pip install "wsync[vllm]"', "pip install 'wsync[torch]'",
                "pip install -U wsync==0.5.0", "`pip install wsync[vllm]`"):
        assert PYPI_INSTALL.search(bad), bad
    for good in ("pip install bindings/python", "pip install --no-deps ./bindings/python",
                 'pip install "./bindings/python[vllm]"',
                 "pip install dist/wsync-0.5.0-py3-none-linux_x86_64.whl",
                 "pip install dist/wsync-*.whl", "pip install hatchling==1.29.0"):
        assert not PYPI_INSTALL.search(good), good


@pytest.mark.parametrize("path", READMES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_readme_never_installs_wsync_from_pypi(path):
    found = [m.group(0) for m in PYPI_INSTALL.finditer(_readme(path))]
    assert not found, f"{path.name}: PyPI's 'wsync' is another project: {found}"


@pytest.mark.parametrize("path", READMES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_readme_wheel_names_carry_the_package_version(path):
    version = _version()
    names = re.findall(r"wsync-(\d+\.\d+\.\d+)-py3-none-[\w.]+\.whl", _readme(path))
    assert all(v == version for v in names), (path.name, names, version)


def test_readme_installs_the_vllm_backend_from_the_source_tree_or_wheel():
    text = _readme(PACKAGE_ROOT / "README.md")
    vllm_section = text.split("## vLLM", 1)[1].split("\n## ", 1)[0]
    assert "pip install --no-deps ./bindings/python" in vllm_section
    assert f"pip install --no-deps dist/wsync-{_version()}-py3-none-linux_x86_64.whl" in vllm_section


def test_readme_does_not_call_an_existing_ucx_kind_future():
    if not (REPO_ROOT / "src" / "transport" / "ucx").is_dir():
        pytest.skip("no ucx transport in this checkout")
    text = _readme(REPO_ROOT / "README.md")
    assert not re.search(r"UCX\s+is\s+next", text)
    strategies = text.split("- **Strategies:**", 1)[1].split("\n- ", 1)[0]
    assert "`ucx`" in strategies


def test_the_top_readmes_vllm_paragraph_lists_every_kind_and_the_pythonpath_caveat():
    text = _readme(REPO_ROOT / "README.md")
    paragraph = text.split("**vLLM.**", 1)[1].split("\nTrainer side", 1)[0]
    assert "`nccl_broadcast` or `ucx`" in paragraph
    assert "PYTHONPATH" in paragraph and "register()" in paragraph
    assert "examples/vllm_cpu.py" in paragraph


def test_the_vllm_section_has_the_cpu_recipe_recovery_and_the_checks_really_made():
    text = _readme(PACKAGE_ROOT / "README.md")
    section = text.split("## vLLM", 1)[1].split("\n## ", 1)[0]
    assert (PACKAGE_ROOT / "examples" / "vllm_cpu.py").is_file()
    assert "python bindings/python/examples/vllm_cpu.py" in section
    assert "PYTHONPATH" in section
    assert "reinit_workers()" in section and "versions restart at 1" in section
    assert "A client that timed out is not called again" in section
    assert "no up-front check of" in section
    assert '"wsync.integrations.vllm:register"' in section
