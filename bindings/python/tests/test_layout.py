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
                       fields["flags"], fields["struct_size"]]
    assert _TENSOR_RAW.size == layout["wsync_tensor_t"]["size"]


def test_nested_dtype_and_device_offsets(layout):
    # wsync_tensor_t embeds the dtype and device structs; their own fields land where DLPack
    # puts them.
    dtype_fields = layout["wsync_dtype_t"]["fields"]
    device_fields = layout["wsync_device_t"]["fields"]
    assert dtype_fields == {"code": 0, "bits": 1, "lanes": 2}
    assert device_fields == {"type": 0, "index": 4}
    assert layout["wsync_tensor_t"]["fields"]["device"] % layout["wsync_device_t"]["align"] == 0


SIZED = sorted(name for name, cls in _lib.STRUCTS.items()
               if any(f[0] == "struct_size" for f in cls._fields_))


def test_every_growable_struct_is_sized():
    # The 0.2 rule: every public struct that may grow has a struct_size field.
    assert SIZED == ["wsync_apply_result_t", "wsync_chunk_t", "wsync_dest_t", "wsync_failure_t", "wsync_patch_t",
                     "wsync_receiver_state_t", "wsync_recv_info_t", "wsync_tensor_t"]


@pytest.mark.parametrize("name", SIZED)
def test_sized_structs_carry_their_own_size(name):
    cls = _lib.STRUCTS[name]
    assert _lib.sized(cls).struct_size == ctypes.sizeof(cls)


def test_new_0_2_structs_have_the_header_field_order(layout):
    # Field order as wsync.h declares it (offsets strictly increasing).
    expected = {
        "wsync_recv_info_t": ["struct_size", "flags", "version", "bytes", "count", "chunk_index",
                              "version_chunks", "version_tensors", "version_bytes"],
        "wsync_failure_t": ["struct_size", "what", "status", "receiver", "version",
                            "chunk_index", "pid", "message"],
        "wsync_receiver_state_t": ["struct_size", "flags", "completed_version", "open_version",
                                   "failed_version", "failed_status", "reserved_"],
        "wsync_patch_t": ["struct_size", "index_bits", "base_version", "count", "elements",
                          "indices", "values", "base_xxh3", "result_xxh3"],
    }
    for name, order in expected.items():
        fields = layout[name]["fields"]
        assert sorted(fields, key=fields.get) == order, name
    assert layout["wsync_failure_t"]["size"] - layout["wsync_failure_t"]["fields"]["message"] == 256


def test_packed_descriptors_carry_struct_size():
    # The hot path writes struct_size into each packed wsync_tensor_t, as the header asks.
    import torch
    from wsync._core import _TENSOR_RAW, describe_tensors
    descs = describe_tensors([("a", torch.ones(2)), ("b", torch.ones(3))])
    for i in range(2):
        assert _TENSOR_RAW.unpack_from(descs.array, _TENSOR_RAW.size * i)[-1] == _TENSOR_RAW.size
