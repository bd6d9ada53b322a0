"""The ctypes struct declarations match the library's own layout (wsync_abi_layout)."""

import ctypes
import struct

import pytest

import wsync
from wsync import _lib


@pytest.fixture(scope="module")
def layout():
    return wsync.abi_layout()


def test_layout_lists_exactly_the_declared_structs(layout):
    structs = [name for name, entry in layout.items() if "fields" in entry]
    assert sorted(structs) == sorted(_lib.STRUCTS)


def test_status_enum_is_32_bits_as_declared(layout):
    status_type = _lib.SIGNATURES["wsync_strategy_create"][0]
    assert layout["wsync_status_t"]["size"] == ctypes.sizeof(status_type) == 4
    assert layout["wsync_status_t"]["align"] == ctypes.alignment(status_type)


@pytest.mark.parametrize("name", sorted(_lib.STRUCTS))
def test_struct_size_and_alignment(layout, name):
    cls = _lib.STRUCTS[name]
    assert ctypes.sizeof(cls) == layout[name]["size"]
    assert ctypes.alignment(cls) == layout[name]["align"]


@pytest.mark.parametrize("name", sorted(_lib.STRUCTS))
def test_struct_fields_and_offsets(layout, name):
    cls = _lib.STRUCTS[name]
    declared = {field[0]: getattr(cls, field[0]).offset for field in cls._fields_}
    assert declared == layout[name]["fields"]


def test_packed_tensor_descriptor_matches_the_library(layout):
    # The hot path packs wsync_tensor_t with struct, not ctypes: its field offsets and total
    # size must be the library's too.
    from wsync._core import _TENSOR_RAW
    fmt = _TENSOR_RAW.format.lstrip("=")
    offsets, off = [], 0
    for code in fmt:
        offsets.append(off)
        off += struct.calcsize("=" + code)
    fields = layout["wsync_tensor_t"]["fields"]
    dtype, device = fields["dtype"], fields["device"]
    assert offsets == [fields["name"], fields["data"], fields["shape"], fields["strides"],
                       fields["ndim"], dtype, dtype + 1, dtype + 2, device, device + 4,
                       fields["flags"], fields["reserved_"]]
    assert _TENSOR_RAW.size == layout["wsync_tensor_t"]["size"]


def test_nested_dtype_and_device_offsets(layout):
    # wsync_tensor_t embeds the dtype and device structs; their own fields land where DLPack
    # puts them.
    dtype_fields = layout["wsync_dtype_t"]["fields"]
    device_fields = layout["wsync_device_t"]["fields"]
    assert dtype_fields == {"code": 0, "bits": 1, "lanes": 2}
    assert device_fields == {"type": 0, "index": 4}
    assert layout["wsync_tensor_t"]["fields"]["device"] % layout["wsync_device_t"]["align"] == 0
