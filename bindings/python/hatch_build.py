"""Build hook: bundles libwsync into the wheel when ``WSYNC_BUNDLE_LIBRARY`` names it."""

import os
import sysconfig

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class BundleLibrary(BuildHookInterface):
    """``WSYNC_BUNDLE_LIBRARY=/path/to/libwsync.so``: the library (symlinks resolved) goes into
    the wheel as ``wsync/libwsync.so.0`` and the wheel is tagged ``py3-none-<platform>`` (the
    binding is ctypes, so any CPython 3 of that platform loads it). Unset: a pure wheel."""

    PLUGIN_NAME = "custom"

    def initialize(self, version, build_data):
        path = os.environ.get("WSYNC_BUNDLE_LIBRARY")
        if self.target_name != "wheel" or not path:
            return
        real = os.path.realpath(path)
        if not os.path.isfile(real):
            raise FileNotFoundError(f"WSYNC_BUNDLE_LIBRARY={path}: no such library")
        build_data["force_include"][real] = "wsync/libwsync.so.0"
        build_data["pure_python"] = False
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        build_data["tag"] = f"py3-none-{platform}"
