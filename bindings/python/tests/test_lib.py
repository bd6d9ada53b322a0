"""Finding the library ($WSYNC_LIBRARY, then the package folder, then the system), refusing a
wrong major version, and declaring every function of wsync.h."""

import ctypes
import re
import shutil

import pytest

import wsync
from wsync import _lib
from conftest import HEADER, PACKAGE_ROOT, needs_header, wsync_library_path


class FakeFunction:
    def __init__(self, value):
        self.value = value
        self.restype = None
        self.argtypes = None

    def __call__(self, *args):
        return self.value


class FakeLibrary:
    """Stands in for a CDLL: a library whose wsync_version_number() returns `number`."""

    def __init__(self, path, number=200):
        self.path = path
        self.wsync_version_number = FakeFunction(number)


def recording_loader(loaded, version=200, loadable=None):
    def load(path):
        if loadable is not None and path not in loadable:
            raise OSError(f"{path}: cannot open shared object file")
        loaded.append(path)
        return FakeLibrary(path, version)

    return load


def no_system(name):
    return None


def test_env_var_is_tried_first_and_is_the_library_used():
    lib = _lib.locate(environ={"WSYNC_LIBRARY": wsync_library_path()})
    assert lib.where == "$WSYNC_LIBRARY"
    assert lib.path == wsync_library_path()
    assert lib.wsync_version_number() == wsync.version_number()


def test_env_var_wins_over_package_folder_and_system(tmp_path):
    (tmp_path / "libwsync.so.0").write_bytes(b"")
    loaded = []
    with pytest.raises(_lib.LibraryError):  # FakeLibrary lacks the other functions
        _lib.locate(environ={"WSYNC_LIBRARY": "/explicit/libwsync.so"}, package_dir=str(tmp_path),
                    find_library=lambda n: "/system/libwsync.so.0", loader=recording_loader(loaded))
    assert loaded == ["/explicit/libwsync.so"]


def test_package_folder_is_used_when_env_var_is_unset(tmp_path):
    shutil.copy(wsync_library_path(), tmp_path / "libwsync.so.0")
    lib = _lib.locate(environ={}, package_dir=str(tmp_path), find_library=no_system)
    assert lib.where == "the package folder"
    assert lib.path == str(tmp_path / "libwsync.so.0")
    assert lib.wsync_version_string().decode() == wsync.version()


def test_package_folder_prefers_soname_then_plain_name(tmp_path):
    (tmp_path / "libwsync.so").write_bytes(b"")
    loaded = []
    with pytest.raises(_lib.LibraryError):
        _lib.locate(environ={}, package_dir=str(tmp_path), find_library=no_system,
                    loader=recording_loader(loaded))
    assert loaded == [str(tmp_path / "libwsync.so")]
    (tmp_path / "libwsync.so.0").write_bytes(b"")
    loaded.clear()
    with pytest.raises(_lib.LibraryError):
        _lib.locate(environ={}, package_dir=str(tmp_path), find_library=no_system,
                    loader=recording_loader(loaded))
    assert loaded == [str(tmp_path / "libwsync.so.0")]


def test_system_is_used_last(tmp_path):
    lib = _lib.locate(environ={}, package_dir=str(tmp_path),
                      find_library=lambda name: wsync_library_path() if name == "wsync" else None)
    assert lib.where == "the system"


def test_not_found_error_names_all_three_places(tmp_path):
    with pytest.raises(wsync.LibraryNotFoundError) as info:
        _lib.locate(environ={}, package_dir=str(tmp_path), find_library=no_system)
    text = str(info.value)
    assert "1. $WSYNC_LIBRARY: not set" in text
    assert f"2. the package folder {tmp_path}: no libwsync.so.0; no libwsync.so" in text
    assert "3. the system (ctypes.util.find_library('wsync')): nothing found" in text
    assert isinstance(info.value, ImportError)


def test_bad_env_var_is_reported_not_replaced(tmp_path):
    shutil.copy(wsync_library_path(), tmp_path / "libwsync.so.0")
    missing = str(tmp_path / "nowhere" / "libwsync.so")
    with pytest.raises(wsync.LibraryNotFoundError) as info:
        _lib.locate(environ={"WSYNC_LIBRARY": missing}, package_dir=str(tmp_path),
                    find_library=lambda n: wsync_library_path())
    text = str(info.value)
    assert f"1. $WSYNC_LIBRARY={missing}: cannot load it" in text
    assert "2. the package folder" in text and "not searched" in text
    assert "3. the system" in text


def test_unloadable_files_are_reported_with_the_loader_error(tmp_path):
    (tmp_path / "libwsync.so.0").write_bytes(b"not an ELF file")
    with pytest.raises(wsync.LibraryNotFoundError) as info:
        _lib.locate(environ={}, package_dir=str(tmp_path),
                    find_library=lambda n: "/no/such/libwsync.so.0")
    text = str(info.value)
    assert "libwsync.so.0 exists but cannot be loaded" in text
    assert "found /no/such/libwsync.so.0 but cannot load it" in text


@pytest.mark.parametrize("number", [10000, 10100, 20304, 990000])
def test_other_major_version_is_refused(number):
    with pytest.raises(wsync.LibraryVersionError) as info:
        _lib.locate(environ={"WSYNC_LIBRARY": "/fake/libwsync.so"},
                    loader=recording_loader([], version=number))
    text = str(info.value)
    assert f"major {number // 10000}" in text
    assert "written for major version 0" in text
    assert "/fake/libwsync.so" in text


def test_same_major_version_from_0_7_passes_the_check():
    assert _lib.check_version(FakeLibrary("x", 700), "x") == 700
    assert _lib.check_version(FakeLibrary("x", 701), "x") == 701
    assert _lib.check_version(FakeLibrary("x", 9999), "x") == 9999


@pytest.mark.parametrize("number", [0, 100, 199, 299, 399, 499, 599, 699])
def test_library_older_than_0_7_is_refused_saying_what_is_needed(number):
    with pytest.raises(wsync.LibraryVersionError) as info:
        _lib.locate(environ={"WSYNC_LIBRARY": "/old/libwsync.so"},
                    loader=recording_loader([], version=number))
    text = str(info.value)
    assert f"is version 0.{number // 100}.{number % 100}" in text
    assert "needs at least 0.7.0" in text and "/old/libwsync.so" in text


def test_loaded_library_is_at_least_the_binding_version():
    assert wsync.version_number() >= _lib.MIN_VERSION_NUMBER == 700


def test_runtime_major_matches_the_binding():
    assert wsync.version_number() // 10000 == wsync.ABI_MAJOR
    assert wsync.version().startswith(f"{wsync.ABI_MAJOR}.")


def test_missing_function_is_reported_by_name(monkeypatch):
    real = ctypes.CDLL(wsync_library_path())

    class Partial:
        def __init__(self):
            self.wsync_version_number = real.wsync_version_number

        def __getattr__(self, name):
            if name == "wsync_recv_peek":
                raise AttributeError(name)
            return getattr(real, name)

    with pytest.raises(wsync.LibraryError, match="lacks functions this binding needs: wsync_recv_peek"):
        _lib.Library(Partial(), "partial", "test")


def _header_functions():
    text = HEADER.read_text()
    return sorted(set(re.findall(r"WSYNC_API\s+[^;(]*?\b(wsync_\w+)\s*\(", text)))


@needs_header
def test_every_header_function_has_a_signature():
    functions = _header_functions()
    assert len(functions) >= 30
    assert sorted(_lib.SIGNATURES) == functions


@needs_header
def test_every_header_function_is_declared_on_the_loaded_library():
    lib = wsync.load_library()
    for name in _header_functions():
        fn = getattr(lib, name)
        restype, argtypes = _lib.SIGNATURES[name]
        assert fn.restype is restype, name
        assert list(fn.argtypes) == list(argtypes), name


@needs_header
def test_every_header_function_is_referenced_in_the_package_sources():
    sources = "".join(p.read_text() for p in (PACKAGE_ROOT / "wsync").glob("*.py"))
    missing = [f for f in _header_functions() if not re.search(rf"\b{f}\b", sources)]
    assert missing == []


@needs_header
def test_status_and_type_codes_mirror_the_header():
    text = HEADER.read_text()
    for name, value in re.findall(r"\bWSYNC_((?:ERR_)?[A-Z_]+) = (\d+),", text):
        if name == "OK":
            assert wsync.Status.OK == int(value)
        else:
            assert wsync.Status[name[len("ERR_"):]] == int(value), name
    for name, value in re.findall(r"#define WSYNC_((?:DTYPE|DEVICE)_\w+) (\d+)", text):
        assert getattr(wsync, name) == int(value), name
    for name in ("TENSOR_READ_ONLY", "CHUNK_LAST", "MAX_NDIM", "MAX_NAME_BYTES",
                 "MAX_BLOB_BYTES", "RECEIVER_DROPPED", "RECEIVER_SENDER_GONE"):
        value = re.search(rf"#define WSYNC_{name} (\d+)", text).group(1)
        assert getattr(wsync, name) == int(value), name
    for name, value in re.findall(r"#define WSYNC_FAILURE_(\w+) (\d+)", text):
        assert wsync.FailureKind[name] == int(value), name
    assert "#define WSYNC_NO_CHUNK UINT32_MAX" in text and wsync.NO_CHUNK == 0xFFFFFFFF
    for name in ("MAJOR", "MINOR"):
        value = re.search(rf"#define WSYNC_VERSION_{name} (\d+)", text).group(1)
        assert getattr(wsync, f"ABI_{name}") == int(value), name
    assert re.search(r"char message\[(\d+)\];", text).group(1) == str(_lib.FAILURE_MESSAGE_BYTES)
