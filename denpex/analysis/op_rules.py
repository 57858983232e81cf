"""What the members of one collective must agree on, per op.

Every member of a collective calls the same op. Whether their tensors' sizes and dtypes must
agree depends on the op, so comparing whole signatures blames ranks whose calls are legal:

- ``gather(dst=r)``: only the root passes ``gather_list``, so only the root records outputs
  (c10d ``ProcessGroup::gather``: non-root ranks pass an empty output list). Inputs must agree.
- ``scatter(src=r)``: only the root passes ``scatter_list`` (its inputs); outputs must agree.
- ``all_to_all`` / ``all_to_all_single`` with split sizes, ``all_gather_v`` /
  ``reduce_scatter_v``: each rank sends and receives its own counts (c10d ``alltoall_base``
  takes per-rank ``input_split_sizes`` / ``output_split_sizes``), so no size need agree.
- every other collective: input and output sizes agree.

This follows torch's own analyzer (``torch/distributed/flight_recorder/components/types.py``,
``Op.match``: input sizes are not compared for ``all_to_all`` and ``scatter``, output sizes not
for ``all_to_all`` and ``gather``; ``Op.dtype_mismatch`` skips input dtypes for ``scatter`` and
``broadcast`` and output dtypes for ``gather``), extended to the single and ``_v`` variants.
Dtypes are compared as sets, as torch does, and only where a rank recorded a tensor.

    >>> root = OpSignature(op="gloo:gather", input_sizes=((4,),), input_dtypes=("Float",),
    ...                    output_sizes=((4,),) * 4, output_dtypes=("Float",) * 4)
    >>> leaf = OpSignature(op="gloo:gather", input_sizes=((4,),), input_dtypes=("Float",))
    >>> agreement_key(root) == agreement_key(leaf)
    True
"""

from __future__ import annotations

from denpex.analysis.summary import OpSignature

__all__ = ["AgreementKey", "agreement_key", "op_type"]

# Sizes legitimately differ per rank on these sides (see the module docstring).
_VARIABLE_INPUT_SIZES = frozenset({
    "scatter", "all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall", "alltoall_base",
    "all_gather_v", "reduce_scatter_v",
})
_VARIABLE_OUTPUT_SIZES = frozenset({
    "gather", "all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall", "alltoall_base",
    "all_gather_v", "reduce_scatter_v",
})
# Only the root records tensors on this side, so a rank's empty side says nothing.
_ROOT_ONLY_INPUT = frozenset({"scatter"})
_ROOT_ONLY_OUTPUT = frozenset({"gather"})
# torch's Op.dtype_mismatch: broadcast's input dtypes are not compared across ranks.
_UNCOMPARED_INPUT_DTYPES = frozenset({"scatter", "broadcast"})
_UNCOMPARED_OUTPUT_DTYPES = frozenset({"gather"})

AgreementKey = tuple[object, ...]


def op_type(op: str) -> str:
    """``"nccl:all_to_all_single"`` -> ``"all_to_all_single"`` (the backend prefix dropped)."""
    return op.rpartition(":")[2].strip()


def agreement_key(signature: OpSignature) -> AgreementKey:
    """The part of ``signature`` that every member's call must share; equal keys agree."""
    kind = op_type(signature.op)
    in_sizes = None if kind in _VARIABLE_INPUT_SIZES else signature.input_sizes
    out_sizes = None if kind in _VARIABLE_OUTPUT_SIZES else signature.output_sizes
    in_dtypes = None if kind in _UNCOMPARED_INPUT_DTYPES or (
        kind in _ROOT_ONLY_INPUT) else frozenset(signature.input_dtypes) or None
    out_dtypes = None if kind in _UNCOMPARED_OUTPUT_DTYPES or (
        kind in _ROOT_ONLY_OUTPUT) else frozenset(signature.output_dtypes) or None
    # A rank with no tensors on one side (an empty all_to_all split list) states no dtype there;
    # mixing the sides keeps the op's element type comparable across such ranks.
    if kind in _VARIABLE_INPUT_SIZES and kind in _VARIABLE_OUTPUT_SIZES:
        in_dtypes = frozenset(signature.input_dtypes) | frozenset(signature.output_dtypes) or None
        out_dtypes = None
    return (signature.op, in_sizes, in_dtypes, out_sizes, out_dtypes)
