"""Engine-side helpers: load received chunks into an ``nn.Module`` in place.

For every request, :class:`ModuleLoader` first checks the chunk's names, dtypes and shapes
against the module's parameters and buffers (a dry run through ``wsync_recv_peek``: no tensor
byte is read). On any difference it raises :class:`wsync.WsyncError` (``MISMATCH``) naming each
tensor and what differs, and the iteration is failed with that status and message
(``Iteration.fail``), so the sender's ``flush`` reports them as a :class:`wsync.Failure` and the
version never completes on this engine. Only then are the bytes copied into the module's
tensors, under ``torch.no_grad()``; a copy that fails, even after the last view, fails the
chunk the same way (with the status :func:`wsync.status_for_exception` gives).

The loader is strict by default, as ``load_state_dict`` is: a version that does not load every
parameter and buffer of the module fails on its last chunk, naming what is missing, so it never
commits. ``map_name`` maps a trainer's names onto the module's, including into part of a fused
parameter (q/k/v into one qkv).

Aliases: a wire tensor whose name joins several names with ``=`` (``"embed_tokens.weight=
lm_head.weight"``, how :func:`wsync.trainer.send_model` sends a tied weight once) is loaded
under every one of them: into the one tensor of a tied module (once), or into each parameter
of an untied one, and the strict check counts every name as loaded. ``map_name`` sees each
name on its own. A name is taken whole instead when the module has a tensor of exactly that
name (and there is no ``map_name``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Tuple, Union

from . import _dtypes
from ._core import Dest, Receiver, RecvInfo, TensorMeta, status_for_exception
from ._dtypes import DType
from ._errors import Status, WsyncError, invalid
from .trainer import _QuickCheck, alias_key, split_alias_name

#: How many differences a mismatch error lists before summarising the rest.
MAX_LISTED_PROBLEMS = 10
# Chunk layouts a ModuleLoader remembers (a model of N chunks per version needs N).
MAX_CACHED_LAYOUTS = 4096


def _bits_equal(a, b) -> bool:
    """Whether two contiguous tensors of one dtype and shape hold the same bytes (NaN payloads
    and -0.0 included)."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(
        (a.reshape(-1).view(_dtypes.require_torch().uint8)
         == b.reshape(-1).view(_dtypes.require_torch().uint8)).all())


def _shape_text(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


#: What a ``map_name`` hook returns for one trainer tensor: ``None`` (skip it), the name of a
#: module tensor, or ``(name, index)`` to load into ``module_tensor[index]`` (a part of a
#: fused parameter, e.g. ``("attn.qkv.weight", slice(0, 64))`` for the q rows).
MappedName = Union[None, str, Tuple[str, Any]]


class ModuleLoader:
    """Loads chunks into a module's parameters and buffers (by ``state_dict`` name) in place.

    In place means a version that fails part-way (a checksum, an abandon, a dead trainer)
    leaves the module holding that version's chunks that arrived over the previous version's
    rest: a mix. Serve from it only while ``receiver.poll().failed_version`` is not the version
    being loaded, or load into a staging copy and swap it in once ``completed_version``
    reaches the new version (README, "Rolling back").

    Contiguous CPU targets of the chunk's own dtype receive the bytes straight into their
    storage through :meth:`wsync.Iteration.copy_into` (the library's copy loop, checksum
    verified in the same pass); other targets (CUDA, casts, non-contiguous parts) copy from the
    views.

    Split tensors (a tensor larger than a bucket, sent in parts over consecutive chunks; see
    :mod:`wsync.trainer`) load transparently: ``copy_into`` of the whole tensor writes each
    part's share at its place, and view targets take each part's flat view
    (:meth:`wsync.Iteration.iter_parts`) into their flat element range, casting if needed;
    non-contiguous targets take it through views of their rows. A target that is not a
    strided tensor cannot take a range: ``UNSUPPORTED`` naming it, before any copy. The strict
    check counts a split tensor as loaded with its parts (the library refuses a version whose
    parts do not cover the tensor).

    - ``strict`` (default ``True``), like ``load_state_dict(strict=True)``: a version that
      leaves a parameter or buffer of the module unloaded is refused on its last chunk with
      ``MISMATCH`` naming what is missing, before that chunk is copied and before the version
      commits (see :meth:`load`).
      Tied tensors (one tensor under several names) count as loaded under any of their names;
      a fused tensor counts once every element of it was loaded. A wire tensor whose name
      joins several names with ``=`` (a tied weight the trainer sent once) loads under, and
      counts for, every one of them (see the module documentation). ``strict=False`` loads what
      comes.
    - ``map_name``: a hook from a trainer tensor's name to where it goes (see
      :data:`MappedName`): rename it, skip it (``None``), or load it into part of a module
      tensor. Without it names are taken as they are.
    - ``allow_cast``: accept a dtype different from the module's (the copy converts); by
      default a dtype difference is a mismatch.
    - ``ignore_unknown``: skip tensors the module does not have instead of failing.

    The module's tensors are read again at the start of each version (about 1-2 us per
    tensor): an engine may convert or move its module between versions (``module.float()``,
    ``.to(device)``, a replaced buffer) and the version is checked and loaded against the
    module as it is then. Do not convert it while a version is loading.
    """

    def __init__(self, module, *, strict: bool = True,
                 map_name: Optional[Callable[[str], MappedName]] = None,
                 allow_cast: bool = False, ignore_unknown: bool = False):
        torch = _dtypes.require_torch()
        if not isinstance(module, (torch.nn.Module, Mapping)):
            raise invalid(f"module must be an nn.Module or a mapping of tensors, not "
                          f"{type(module).__name__}")
        if map_name is not None and not callable(map_name):
            raise invalid(f"map_name must be callable, not {type(map_name).__name__}")
        self._module = module
        self.strict = strict
        self.map_name = map_name
        self.allow_cast = allow_cast
        self.ignore_unknown = ignore_unknown
        self._version = None
        # Per chunk layout (the tuple of its TensorMetas, the same every version while the
        # trainer's plan stays): destinations and coverage, so a repeated chunk skips name
        # resolution and checks. map_name is thus called once per layout and must depend on the
        # name alone.
        self._plans: Dict[tuple, tuple] = {}
        # The one-call path (Receiver.dest_table + Iteration.apply): per receiver (by id), a
        # destination table learnt from a version loaded the per-tensor way, used from the next
        # version on while the module's tensors stay the same; see _learn and _apply_table.
        self._fast: Dict[int, _FastPath] = {}
        self._version_fast = False
        self._learning: Optional[dict] = None
        self._take_targets(self._read_targets())
        # Receivers (by id) whose kind has no device copy (none of libwsync 0.5's; an older
        # library's nccl_broadcast): GPU targets take views there, after the first UNSUPPORTED.
        self._no_device_copy: set = set()
        # Per module tensor, the parts this version loaded: {part: elements}; a part is the
        # index given by map_name (None for the whole tensor), so a part loaded twice counts once.
        self._covered: Dict[Any, Dict[str, int]] = {}
        # Tied tensors the trainer sends under each name (aliases="repeat") with delta: every
        # name's patch is against the same base, and the storage takes only the first. Per
        # module tensor patched this version whose other names may still come: (the name that
        # patched it, a copy of its base), against which a later name's patch is checked.
        self._patch_bases: Dict[Any, Tuple[str, Any]] = {}

    def _read_targets(self) -> Dict[str, object]:
        if isinstance(self._module, Mapping):
            return dict(self._module)
        return dict(self._module.state_dict(keep_vars=True))

    @staticmethod
    def _signature(targets: Dict[str, object]) -> tuple:
        """What the checks, ties and plans depend on, per target: the object, its dtype and
        shape, and the memory it sees (``alias_key``: a move to another device or a
        conversion and back gives parameters made over one storage storages of their own,
        so they are no longer tied)."""
        return tuple((name, id(t), getattr(t, "dtype", None), tuple(getattr(t, "shape", ())),
                      alias_key(t)) for name, t in targets.items())

    def _take_targets(self, targets: Dict[str, object]) -> None:
        """Takes the module's tensors as they are now and forgets what was derived from the
        earlier ones (dtypes, ties, cached plans)."""
        self.targets: Dict[str, object] = targets
        self._signature_now = self._signature(targets)
        self._quick = _QuickCheck.of(self._module, list(targets))
        self._dtypes = {name: DType.from_torch(t.dtype) for name, t in targets.items()}
        # Tied tensors: one memory, several names; coverage is counted per tensor. Two names
        # are one tensor when they are the same object or see the same memory the same way
        # (address, dtype, shape, strides: the trainer's alias rule), so parameters made over
        # one storage (``Parameter(other.data)``, a mapping of views) count as tied too.
        self._key_of: Dict[str, Any] = {}
        self._names_of: Dict[Any, List[str]] = {}
        for name, t in targets.items():
            key = alias_key(t)
            self._key_of[name] = ("object", id(t)) if key is None else key
            self._names_of.setdefault(self._key_of[name], []).append(name)
        self._plans.clear()
        for fast in self._fast.values():  # made over the tensors the module no longer holds
            fast.table.close()
        self._fast.clear()

    def _refresh_targets(self) -> None:
        """At each version's start: an engine may convert or move its module between versions
        (``module.float()``, ``.to(device)``, ``.half()``); that changes a parameter's dtype in
        place and replaces every buffer with a new tensor. Loading by what was taken earlier
        would copy raw bytes of the old dtype into the new storage, or into buffers the module
        no longer holds. About 1-2 us per tensor, once per version."""
        if self._quick is not None and self._quick.unchanged():
            return  # the same tensor objects over the same memory (about 1 us a tensor)
        targets = self._read_targets()
        if self._signature(targets) != self._signature_now:
            self._take_targets(targets)
        else:
            self._quick = _QuickCheck.of(self._module, list(targets))

    def _resolve(self, name: str):
        """(module tensor name, index or None) for a trainer tensor, or None to skip it."""
        if self.map_name is None:
            return name, None
        try:
            mapped = self.map_name(name)
        except Exception as exc:
            # The hook's own error, with the tensor it was called for: the chunk fails with
            # the status the exception maps to, and the trainer's flush names the tensor.
            raise WsyncError(status_for_exception(exc),
                             f"map_name('{name}') raised {type(exc).__name__}: {exc}") from exc
        if mapped is None or isinstance(mapped, str):
            return None if mapped is None else (mapped, None)
        if isinstance(mapped, tuple) and len(mapped) == 2 and isinstance(mapped[0], str):
            return mapped
        raise invalid(f"map_name('{name}') returned {mapped!r}: expected None, a name, or "
                      f"(name, index)")

    def _resolve_all(self, wire_name: str) -> List[Tuple[str, Tuple[str, Any]]]:
        """(name, resolved) for each name a wire tensor carries (its aliases, see the module
        documentation), skipping the names ``map_name`` skips."""
        if self.map_name is None and wire_name in self.targets:
            names = [wire_name]
        else:
            names = split_alias_name(wire_name)
        out = []
        for name in names:
            resolved = self._resolve(name)
            if resolved is not None:
                out.append((name, resolved))
        return out

    def _destination(self, resolved):
        target_name, index = resolved
        target = self.targets.get(target_name)
        if target is None or index is None:
            return target
        return target.detach()[index]

    def check(self, metas: Iterable[TensorMeta]) -> List[str]:
        """The differences between a chunk's tensors and the module, one line each (empty when
        the chunk fits)."""
        problems = []
        for m in metas:
            for name, resolved in self._resolve_all(m.name):
                problems += self._check_one(m, name, resolved)
        return problems

    def _check_one(self, m: TensorMeta, name: str, resolved) -> List[str]:
        problems: List[str] = []
        target_name, index = resolved
        where = f"tensor '{name}'" + (f" (-> '{target_name}')" if target_name != name
                                        or index is not None else "")
        if name != m.name:
            where += f" (of '{m.name}')"
        if target_name not in self.targets:
            if not self.ignore_unknown:
                problems.append(f"{where} is not a parameter or buffer of the model")
            return problems
        want_dtype = self._dtypes[target_name]
        if m.dtype != want_dtype and not self.allow_cast:
            problems.append(f"{where}: dtype differs: request has {m.dtype.name}, "
                            f"model has {want_dtype.name}")
        try:
            want_shape = tuple(self._destination(resolved).shape)
        except (IndexError, TypeError, ValueError, RuntimeError) as exc:
            problems.append(f"{where}: index {index!r} does not apply to "
                            f"'{target_name}': {exc}")
            return problems
        if tuple(m.shape) != want_shape:
            problems.append(f"{where}: shape differs: request has "
                            f"{_shape_text(m.shape)}, model has {_shape_text(want_shape)}")
        return problems

    def missing(self, metas: Iterable[TensorMeta] = ()) -> List[str]:
        """The module's tensors this version has not loaded yet (counting ``metas``, a chunk
        about to be loaded), one name each (tied names joined with ``=``)."""
        increments = []
        for m in metas:
            for _, resolved in self._resolve_all(m.name):
                if resolved[0] in self.targets:
                    increments.append((self._key_of[resolved[0]], repr(resolved[1]),
                                       _numel(m.shape)))
        return self._missing(increments)

    def _missing(self, increments) -> List[str]:
        """missing() after a chunk adding `increments` (see _plan)."""
        covered = {key: dict(parts) for key, parts in self._covered.items()}
        for key, part, numel in increments:
            covered.setdefault(key, {})[part] = numel
        out = []
        for key, names in self._names_of.items():
            target = self.targets[names[0]]
            if sum(covered.get(key, {}).values()) < target.numel():
                out.append("=".join(names))
        return out

    def _repeated_patch(self, it, i: int, m: TensorMeta, wire_name: str, target_name: str,
                        dst) -> bool:
        """For a tied module tensor (several names, one storage) and a patch entry: True if
        another name already patched it this version, after checking that this name's patch,
        applied by the library to a copy of the same base, gives the same bytes (``MISMATCH``
        otherwise); before the first name's patch, keeps a copy of the base if the wire entry
        does not carry every name of the tensor (the trainer's ``aliases="repeat"``)."""
        key = self._key_of[target_name]
        names = self._names_of.get(key, ())
        if len(names) < 2 or not it.is_patch(i):
            return False
        if key in self._patch_bases:
            first, base = self._patch_bases[key]
            result = base.clone()
            it.copy_into(i, result, nbytes=m.nbytes)  # checks this patch's base and result
            if result.is_cuda:  # the patch runs on the receiver's stream: wait before reading
                _dtypes.require_torch().cuda.synchronize(result.device)
            if not _bits_equal(result, dst):
                raise WsyncError(
                    Status.MISMATCH,
                    f"tensor '{wire_name}' is the same tensor as '{first}' in this model (tied), "
                    f"but its patch in version {it.info.version} gives other bytes: the trainer's "
                    "tensors are not tied; load them into separate tensors")
            return True
        carried = {resolved[0] for _, resolved in self._resolve_all(wire_name)}
        if not set(names) <= carried:
            self._patch_bases[key] = (wire_name, dst.detach().clone())
        return False

    def load(self, receiver: Receiver, request: bytes) -> RecvInfo:
        """Receives one request into the module; returns the chunk's :class:`wsync.RecvInfo`.

        Raises ``MISMATCH`` before any byte is copied when the chunk does not fit the model,
        or, with ``strict``, on the last chunk of a version that leaves some of the module's
        tensors unloaded (naming them; the chunk is not copied and the version does not
        commit); or the error of a copy that failed. Either way the chunk is failed with that
        status and message, which the trainer's flush reports. Raises the library's error
        when receiving or verifying fails.
        """
        try:
            return self._load(receiver, request)
        except BaseException:
            self._patch_bases = {}  # a version that failed here keeps no copy of a base
            raise

    def _load(self, receiver: Receiver, request: bytes) -> RecvInfo:
        info = self._load_chunk(receiver, request)
        learnt = self._learning
        if info.last and learnt is not None and learnt["ok"] and learnt["dests"]:
            self._learning = None
            self._make_table(receiver, learnt)
        return info

    def _make_table(self, receiver: Receiver, learnt: dict) -> None:
        """After a version loaded the per-tensor way whose every destination the library can
        fill itself: the destination table for the next versions (one call a chunk)."""
        dests = [Dest(name, dst, dtype=m.dtype, shape=tuple(m.shape))
                 for name, (m, dsts) in learnt["dests"].items() for dst in dsts]
        try:
            table = receiver.dest_table(dests)
        except WsyncError:
            return  # memory the library cannot fill (another GPU...): the per-tensor way stays
        old = self._fast.pop(id(receiver), None)
        if old is not None:
            old.table.close()
        self._fast[id(receiver)] = _FastPath(receiver, table, frozenset(learnt["skipped"]))

    def _apply_table(self, it, info: RecvInfo, fast: "_FastPath") -> bool:
        """Loads the chunk through the receiver's destination table: one library call (one
        kernel launch for the GPU kinds). False when the table does not fit the version's first
        chunk (a tensor it has no destination for, another dtype or shape, memory the module
        gave up): that version then loads the per-tensor way and the table is learnt anew."""
        try:
            result = it.apply(fast.table, partial=bool(fast.skipped) or self.ignore_unknown,
                              complete=self.strict)
        except WsyncError as exc:
            if info.chunk_index == 0 and exc.status in (Status.MISMATCH, Status.INVALID_ARGUMENT,
                                                       Status.UNSUPPORTED):
                self._fast.pop(id(fast.receiver), None)
                fast.table.close()
                self._version_fast = False
                return False
            raise
        if result.unmatched:  # tensors this loader skips (map_name gave None, unknown ones)
            for pv in it.iter_parts():
                if pv.name not in fast.skipped and not self.ignore_unknown:
                    raise WsyncError(
                        Status.MISMATCH,
                        f"chunk {info.chunk_index} of version {info.version} does not match the "
                        f"model: tensor '{pv.name}' is not a parameter or buffer of the model")
        if it.cuda_index is not None and not getattr(fast.receiver, "orders_loader_work", False):
            _dtypes.require_torch().cuda.synchronize(it.cuda_index)
        return True

    def _learn(self, it, metas, destinations: dict) -> None:
        """Notes, for the version being loaded the per-tensor way, what a destination table
        needs: each wire tensor's destinations if the library can fill them (contiguous
        tensors of the wire's dtype in the chunk's memory, one each), else that it cannot."""
        learnt = self._learning
        if learnt is None or not learnt["ok"]:
            return
        torch = _dtypes.require_torch()
        gpu = it.cuda_index
        for m in metas:
            entry = destinations.get(m.name)
            if entry is None:
                learnt["skipped"].add(m.name)
                continue
            if m.name in learnt["dests"]:  # another part of a split tensor
                continue
            dsts = entry[2]
            if len(dsts) != 1:
                learnt["ok"] = False
                return
            (resolved, dst), = dsts
            # One module tensor taken under two wire names (tied here, sent as two): the
            # per-tensor path checks their patches against each other; keep it.
            key = (self._key_of[resolved[0]], repr(resolved[1]))
            if key in learnt["keys"]:
                learnt["ok"] = False
                return
            learnt["keys"].add(key)
            if not (isinstance(dst, torch.Tensor) and dst.layout == torch.strided
                    and dst.is_contiguous() and m.dtype == self._dtypes[resolved[0]]
                    and tuple(dst.shape) == tuple(m.shape)
                    and ((dst.device.type == "cpu" and gpu is None)
                         or (dst.is_cuda and dst.device.index == gpu))):
                learnt["ok"] = False
                return
            learnt["dests"][m.name] = (m, [dst.detach()])

    def _load_chunk(self, receiver: Receiver, request: bytes) -> RecvInfo:
        torch = _dtypes.require_torch()
        with receiver.receive(request, framework="torch") as it:
            info = it.info
            if info.version != self._version or info.chunk_index == 0:
                self._version, self._covered, self._patch_bases = info.version, {}, {}
                self._refresh_targets()
                fast = self._fast.get(id(receiver))
                self._version_fast = fast is not None and fast.receiver is receiver
                self._learning = None if self._version_fast else {"ok": True, "dests": {},
                                                                   "skipped": set(), "keys": set()}
            if self._version_fast:
                if self._apply_table(it, info, self._fast[id(receiver)]):
                    return info
                self._learning = {"ok": True, "dests": {}, "skipped": set(), "keys": set()}
            metas = it.metas()
            layout = tuple(metas)
            plan = self._plans.get(layout)
            problems = self.check(metas) if plan is None else ()
            if problems:
                listed = problems[:MAX_LISTED_PROBLEMS]
                more = len(problems) - len(listed)
                raise WsyncError(
                    Status.MISMATCH,
                    f"chunk {info.chunk_index} of version {info.version} does not match the model: "
                    + "; ".join(listed) + (f"; and {more} more" if more > 0 else ""))
            if plan is None:
                plan = self._plan(metas)
                if len(self._plans) >= MAX_CACHED_LAYOUTS:
                    self._plans.clear()
                self._plans[layout] = plan
            if self.strict and info.last:
                missing = self._missing(plan[1])
                if missing:
                    listed = missing[:MAX_LISTED_PROBLEMS]
                    more = len(missing) - len(listed)
                    raise WsyncError(
                        Status.MISMATCH,
                        f"version {info.version} does not load {len(missing)} tensor(s) of the "
                        f"model (strict): missing " + ", ".join(f"'{n}'" for n in listed)
                        + (f" and {more} more" if more > 0 else ""))
            # Per wire tensor: (index, meta, [destination...]); an alias list gives several
            # destinations, one per distinct module tensor (or part of one) it names. Indexed
            # destinations are views made now, so they see the target's storage as it is.
            destinations = {
                name: (i, m, [(resolved, target if resolved[1] is None else target.detach()[resolved[1]])
                              for resolved, target in dsts])
                for name, (i, m, dsts) in plan[0].items()}
            self._learn(it, metas, destinations)
            # Split tensors: an entry may carry only a byte range (a part) of its tensor. The
            # whole-size copy_into below writes the part's share at its place; views of parts
            # come flat (iter_parts) and go into the destination's flat element range.
            ranges = {}
            any_part = False
            # A chunk whose payload is its tensors' whole sizes holds no part: skip the lookups.
            maybe_parts = info.bytes != sum(m.nbytes for m in metas)
            for i, m in enumerate(metas if maybe_parts else ()):
                part = it.part(i)
                if part.offset == 0 and part.nbytes == m.nbytes:
                    continue
                any_part = True  # even one without a destination: plain iteration refuses it
                if m.name not in destinations:
                    continue
                dsts = destinations[m.name][2]
                size = m.dtype.itemsize
                ranges[m.name] = (part.offset // size, (part.offset + part.nbytes) // size)
                for resolved, dst in dsts:
                    if not isinstance(dst, torch.Tensor) or dst.layout != torch.strided:
                        raise WsyncError(
                            Status.UNSUPPORTED,
                            f"tensor '{m.name}' arrives in parts (bytes {part.offset}.."
                            f"{part.offset + part.nbytes} of {m.nbytes}) and its destination "
                            f"'{resolved[0]}' is not a strided tensor that takes a flat range")
            cuda_devices = set()
            copied = {}
            with torch.no_grad():
                # Host targets of the chunk's own dtype get the bytes straight into their
                # storage (the library's copy, checksum verified in the same pass); the rest
                # (GPU targets, casts, non-contiguous parts) come as views, which skip those
                # copied; unknown or skipped tensors are taken unread. The other destinations
                # of a tensor copied that way copy from that one (it holds the wire bytes).
                # GPU targets on the chunk's own GPU take the same call where the kind has a
                # device copy (the GPU kinds): one library call and one queued driver copy per tensor
                # instead of a view and a copy_ (measured on an H100 in docs/gpu-validation.md).
                host_chunk = it.cuda_index is None
                gpu = None if host_chunk or id(receiver) in self._no_device_copy else it.cuda_index
                for name, (i, m, dsts) in destinations.items():
                    for resolved, dst in dsts:
                        if not (isinstance(dst, torch.Tensor) and dst.is_contiguous()
                                and m.dtype == self._dtypes[resolved[0]]):
                            continue
                        # Only where copy_into takes dst (the branches below): elsewhere the
                        # tensor loads through views, as before (review: a GPU target on a host
                        # kind with a mirror was sent into copy_into and refused).
                        takes = ((dst.device.type == "cpu" and host_chunk)
                                 or (dst.is_cuda and gpu is not None and dst.device.index == gpu))
                        if (resolved[1] is None and takes
                                and self._repeated_patch(it, i, m, name, resolved[0], dst)):
                            copied[name] = dst  # checked equal to what its storage holds
                            break
                        if dst.device.type == "cpu" and host_chunk:
                            it.copy_into(i, dst.detach(), nbytes=m.nbytes)
                        elif dst.is_cuda and gpu is not None and dst.device.index == gpu:
                            try:
                                it.copy_into(i, dst.detach(), nbytes=m.nbytes)
                            except WsyncError as exc:
                                if exc.status is not Status.UNSUPPORTED:
                                    raise
                                self._no_device_copy.add(id(receiver))  # views from now on
                                gpu = None
                                continue
                            cuda_devices.add(dst.device)
                        else:
                            continue
                        copied[name] = dst
                        break
                if not any_part:
                    for name, view in it:
                        entry = destinations.get(name)
                        if entry is None:
                            continue
                        for _, dst in entry[2]:
                            dst.copy_(view)
                            if dst.is_cuda:
                                cuda_devices.add(dst.device)
                else:
                    for pv in it.iter_parts():
                        entry = destinations.get(pv.name)
                        if entry is None:
                            continue
                        for _, dst in entry[2]:
                            if pv.name in ranges:
                                _copy_flat(dst, pv.start, pv.stop, pv.view)
                            else:
                                dst.copy_(pv.view.view(pv.shape))
                            if dst.is_cuda:
                                cuda_devices.add(dst.device)
                for name, src in copied.items():
                    span = ranges.get(name)
                    for _, dst in destinations[name][2]:
                        if dst is not src:
                            if span is None:
                                dst.copy_(src)
                            else:  # only this part's range: the rest came with other chunks
                                _copy_flat(dst, span[0], span[1],
                                           src.detach().view(-1)[span[0]:span[1]])
                            if dst.is_cuda:
                                cuda_devices.add(dst.device)
            # The views die when the iteration ends: make sure no copy still reads them. With
            # cuda_ipc the library does it (the chunk is acknowledged once the default stream
            # has run these copies, and the version once all of them ran), so the engine goes
            # on to the next chunk while this one's copies run. Copies on another current
            # stream are still waited for here.
            for device in cuda_devices:
                stream = torch.cuda.current_stream(device)
                if not (getattr(receiver, "orders_loader_work", False)
                        and stream == torch.cuda.default_stream(device)):
                    stream.synchronize()
            for key, part, numel in plan[1]:
                self._covered.setdefault(key, {})[part] = numel
            if info.last:
                self._patch_bases = {}  # the copies of bases: not kept between versions
        return info

    def _plan(self, metas: List[TensorMeta]) -> tuple:
        """What loading a chunk of this layout takes, worked out once per layout: for each wire
        tensor with a destination, (index, meta, [(resolved, target tensor)...]), and the
        coverage each loaded tensor adds, [(target key, part, elements)...]."""
        plan, increments = {}, []
        for i, m in enumerate(metas):
            seen, dsts = set(), []
            names = self._resolve_all(m.name)
            for _, resolved in names:
                if resolved[0] not in self.targets:
                    continue
                target = self.targets.get(resolved[0])  # as _destination reads it
                key = (self._key_of[resolved[0]], repr(resolved[1]))
                if key not in seen:
                    seen.add(key)
                    dsts.append((resolved, target))
            if dsts:
                plan[m.name] = (i, m, dsts)
                for _, resolved in names:
                    if resolved[0] in self.targets:
                        increments.append((self._key_of[resolved[0]],
                                           repr(resolved[1]), _numel(m.shape)))
        return plan, increments

    def load_all(self, receiver: Receiver, requests: Iterable[bytes]) -> int:
        """Loads every request in order; returns the receiver's completed version after."""
        for request in requests:
            self.load(receiver, request)
        return receiver.completed_version


class _FastPath(NamedTuple):
    """A receiver's destination table as ModuleLoader uses it (``skipped``: wire tensors the
    version it was learnt from carried and the module takes none of)."""

    receiver: Receiver
    table: Any
    skipped: frozenset


def _copy_flat(dst, start: int, stop: int, src) -> None:
    """Copies ``src`` (1-D, ``stop - start`` elements) into elements ``[start, stop)`` of
    ``dst`` counted in row-major order (a part of a split tensor), casting as ``copy_`` does.
    A non-contiguous ``dst`` is written through at most two partial rows per dimension and one
    block of whole rows, all views of it, so any strided destination takes the range."""
    if stop <= start:
        return
    if dst.dim() == 0:
        dst.copy_(src.reshape(()))
        return
    if dst.is_contiguous():
        dst.view(-1)[start:stop].copy_(src)
        return
    if dst.dim() == 1:
        dst[start:stop].copy_(src)
        return
    inner = _numel(dst.shape[1:])
    r0, o0 = divmod(start, inner)
    r1, o1 = divmod(stop, inner)
    if r0 == r1:
        _copy_flat(dst[r0], o0, o1, src)
        return
    pos = 0
    if o0:
        _copy_flat(dst[r0], o0, inner, src[:inner - o0])
        pos, r0 = inner - o0, r0 + 1
    if r1 > r0:
        n = (r1 - r0) * inner
        dst[r0:r1].copy_(src[pos:pos + n].view(r1 - r0, *dst.shape[1:]))
        pos += n
    if o1:
        _copy_flat(dst[r1], 0, o1, src[pos:])


def _numel(shape) -> int:
    n = 1
    for extent in shape:
        n *= int(extent)
    return n


def load_into_module(receiver: Receiver, request: bytes, module, *, allow_cast: bool = False,
                     ignore_unknown: bool = False,
                     map_name: Optional[Callable[[str], MappedName]] = None) -> RecvInfo:
    """One-call form of :meth:`ModuleLoader.load` for one chunk (not strict: a lone chunk
    cannot tell what a whole version loads; keep a :class:`ModuleLoader` when loading
    versions)."""
    return ModuleLoader(module, strict=False, map_name=map_name, allow_cast=allow_cast,
                        ignore_unknown=ignore_unknown).load(receiver, request)
