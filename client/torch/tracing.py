"""Capturing an ``nn.Module`` (``torch.fx``, or ``torch.export`` where fx cannot keep its ops
apart): the one place that decides the op names.

:func:`baechi.client.torch.profile` and :func:`baechi.client.torch.apply_plan` both trace the
module here, so a plan made from a profile names exactly the nodes ``apply_plan`` finds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from baechi.client.errors import ProfileError

#: How many submodules :func:`trace` may turn into leaves on its own before it gives up.
MAX_AUTOMATIC_LEAVES = 64


def trace(module: Any, leaf_modules: Iterable[type | str] = (),
          example_inputs: tuple[Any, ...] | None = None) -> Any:
    """The graph of ``module``'s forward whose nodes are the ops: ``torch.fx``, or
    ``torch.export`` where fx would make whole submodules one op.

    ``torch.fx`` first: its ops are the leaf modules (a ``Linear``, a ``LayerNorm``) and the
    calls between them, a granularity placement can use. Where tracing fails inside a
    submodule (data-dependent control flow, as in the attention masks of Hugging Face's GPT-2
    and Llama), fx can only keep that submodule as one ``call_module`` node (BaechiPyTorch's
    granularity) — often the whole model body. Then, given ``example_inputs`` (and no
    ``leaf_modules`` of the caller's), the module is captured with ``torch.export``
    (non-strict, the training IR): its ops are the ATen calls, parameters stay the module's
    own objects, and the captured module trains with eager autograd and the caller's
    optimizer. Only where export fails too do the fx leaves stay.

    Capture is deterministic, so :func:`baechi.client.torch.profile` and
    :func:`baechi.client.torch.apply_plan` find the same ops. ``graph_module.meta`` says
    which capture was used (``"baechi_capture"``: ``"torch.fx"`` or ``"torch.export"``) and
    which submodules fx made one op (``"baechi_leaf_modules"``).

    Parameters
    ----------
    module : torch.nn.Module
    leaf_modules : iterable of module classes or qualified submodule names
        Submodules kept as one op from the start (a coarser granularity; fx only).
    example_inputs : tuple, optional
        The forward's positional inputs, for ``torch.export`` (shapes are specialised to
        them: train with batches of the same shapes).

    Raises
    ------
    ProfileError
        Neither capture works; the message names fx's failure.
    """
    try:
        traced = _fx_trace(module, leaf_modules)
    except ProfileError as exc:
        traced, failure = None, exc
    if example_inputs is not None and not tuple(leaf_modules) and (
            traced is None or traced.meta["baechi_leaf_modules"]):
        exported = _export(module, example_inputs)
        if exported is not None:
            return exported
    if traced is None:
        raise failure
    return traced


def _export(module: Any, example_inputs: tuple[Any, ...]) -> Any | None:
    """``torch.export`` (non-strict) of ``module`` as a runnable ``GraphModule``, or ``None``
    where export fails."""
    import torch

    try:
        exported = torch.export.export(module, tuple(example_inputs), strict=False).module()
    except Exception:
        return None
    exported.meta["baechi_capture"] = "torch.export"
    exported.meta["baechi_leaf_modules"] = []
    return exported


def _fx_trace(module: Any, leaf_modules: Iterable[type | str]) -> Any:
    """``torch.fx`` trace of ``module``; submodules fx cannot trace become leaf modules."""
    import torch.fx

    classes = tuple(x for x in leaf_modules if isinstance(x, type))
    names = {x for x in leaf_modules if isinstance(x, str)}
    paths = {id(m): path for path, m in module.named_modules() if path}
    automatic: list[str] = []

    class Tracer(torch.fx.Tracer):
        def is_leaf_module(self, m: Any, qualified_name: str) -> bool:
            if qualified_name in names or (classes and isinstance(m, classes)):
                return True
            return super().is_leaf_module(m, qualified_name)

    while True:
        try:
            graph = Tracer().trace(module)
            break
        except Exception as exc:
            failing = _failing_submodule(exc, paths)
            if failing is None or failing in names or len(automatic) >= MAX_AUTOMATIC_LEAVES:
                raise ProfileError(
                    f"torch.fx cannot trace {type(module).__name__}.forward: "
                    f"{type(exc).__name__}: {exc} (move the code it fails on into a submodule, "
                    "which then becomes one op, or wrap it with torch.fx.wrap)") from exc
            names.add(failing)
            automatic.append(failing)
    traced = torch.fx.GraphModule(module, graph, class_name=type(module).__name__)
    traced.meta["baechi_capture"] = "torch.fx"
    traced.meta["baechi_leaf_modules"] = automatic
    return traced


def _failing_submodule(exc: BaseException, paths: dict[int, str]) -> str | None:
    """Qualified name of the innermost submodule whose code raised ``exc`` while tracing."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if owner is not None and id(owner) in paths:
            found = paths[id(owner)]
        tb = tb.tb_next
    return found


def tensors(value: Any) -> list[Any]:
    """The tensors inside an FX value (a tensor, or tuples/lists/dicts of them)."""
    import torch
    from torch.utils._pytree import tree_leaves

    return [x for x in tree_leaves(value) if isinstance(x, torch.Tensor)]


def nbytes(value: Any) -> int:
    """Bytes of the tensors inside ``value`` (shape × element size; views count in full)."""
    return sum(t.numel() * t.element_size() for t in tensors(value))


def op_type(node: Any, module: Any) -> str:
    """A readable type for an FX node: the module class, function or method name."""
    if node.op == "call_module":
        return type(module.get_submodule(node.target)).__name__
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    if node.op == "call_method":
        return str(node.target)
    return node.op


#: ``operator`` functions that update their first argument in place (``x += y``).
_INPLACE_OPERATORS = frozenset({"iadd", "isub", "imul", "itruediv", "ifloordiv", "imod",
                                "ipow", "iand", "ior", "ixor", "ilshift", "irshift",
                                "imatmul", "setitem"})


def mutates_input(node: Any, module: Any) -> bool:
    """Whether ``node`` writes into its first input (``x.add_(y)``, ``x += y``,
    ``F.relu(x, inplace=True)``, ``nn.ReLU(inplace=True)``)."""
    import operator

    if node.op == "call_method":
        return str(node.target).endswith("_") and not str(node.target).endswith("__")
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        if getattr(operator, name, None) is node.target and name in _INPLACE_OPERATORS:
            return True
        trailing = name.endswith("_") and not name.endswith("__")  # torch.relu_, ...
        return bool(node.kwargs.get("inplace")) or trailing
    if node.op == "call_module":
        return bool(getattr(module.get_submodule(node.target), "inplace", False))
    return False


#: Methods and attributes that read a tensor's metadata, not its data.
METADATA_METHODS = frozenset({"size", "dim", "numel", "ndimension", "nelement", "stride",
                              "element_size", "is_contiguous", "get_device"})
METADATA_ATTRIBUTES = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "layout",
                                 "requires_grad"})


def reads_metadata_only(node: Any) -> bool:
    """Whether ``node`` reads only the metadata of its inputs (``x.size(1)``, ``x.shape``):
    it needs no copy of the data on its own device."""
    import builtins

    if node.op == "call_method":
        return node.target in METADATA_METHODS
    if node.op == "call_function" and node.target is builtins.getattr:
        return len(node.args) > 1 and node.args[1] in METADATA_ATTRIBUTES
    return False


def owned_tensors(node: Any, module: Any) -> dict[str, Any]:
    """Qualified name → parameter or buffer that ``node`` owns (a leaf module's, an attribute)."""
    import torch

    if node.op == "call_module":
        sub = module.get_submodule(node.target)
        prefix = f"{node.target}."
        out = {prefix + n: p for n, p in sub.named_parameters()}
        out.update({prefix + n: b for n, b in sub.named_buffers()})
        return out
    if node.op == "get_attr":
        path, _, attr = node.target.rpartition(".")
        value = getattr(module.get_submodule(path) if path else module, attr)
        if isinstance(value, torch.Tensor):
            return {node.target: value}
    return {}


__all__ = [
    "METADATA_ATTRIBUTES",
    "METADATA_METHODS",
    "mutates_input",
    "nbytes",
    "op_type",
    "owned_tensors",
    "reads_metadata_only",
    "tensors",
    "trace",
]
