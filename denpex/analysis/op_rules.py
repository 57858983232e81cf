"""Every table of op names the analysis reads: which ops are rooted, and, per op, what the members
of one collective must agree on (the rule that reads them is
:func:`denpex.analysis.compare.agreement.agreement_key`).

The tables are data and import nothing of Denpex: the per-rank summary reads ``ROOTED_OPS``
while it builds the progress the comparison later reads, so they sit below both.

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

    >>> op_type("nccl:all_to_all_single") in VARIABLE_INPUT_SIZES & VARIABLE_OUTPUT_SIZES
    True
    >>> "gloo:gather" in ROOTED_OPS
    True
"""

from __future__ import annotations

__all__ = [
    "ROOTED_OPS",
    "ROOT_ONLY_INPUT",
    "ROOT_ONLY_OUTPUT",
    "UNCOMPARED_INPUT_DTYPES",
    "UNCOMPARED_OUTPUT_DTYPES",
    "VARIABLE_INPUT_SIZES",
    "VARIABLE_OUTPUT_SIZES",
    "op_type",
]

# Rooted ops complete on some members before every member entered: Gloo's gather and scatter
# retire on non-root ranks once their own send or recv with the root is done (measured: issue 9's
# gather_skip and scatter_skip), and NCCL's ring/tree broadcast and reduce let ranks upstream of
# a missing one finish. Completing one proves nothing about the other members.
ROOTED_OPS = frozenset(f"{backend}:{op}" for backend in ("gloo", "nccl") for op in (
    "broadcast", "_broadcast_oop", "reduce", "_reduce_oop", "gather", "scatter"))

# Sizes legitimately differ per rank on these sides (see the module docstring).
VARIABLE_INPUT_SIZES = frozenset({
    "scatter", "all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall", "alltoall_base",
    "all_gather_v", "reduce_scatter_v",
})
VARIABLE_OUTPUT_SIZES = frozenset({
    "gather", "all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall", "alltoall_base",
    "all_gather_v", "reduce_scatter_v",
})
# Only the root records tensors on this side, so a rank's empty side says nothing.
ROOT_ONLY_INPUT = frozenset({"scatter"})
ROOT_ONLY_OUTPUT = frozenset({"gather"})
# torch's Op.dtype_mismatch: broadcast's input dtypes are not compared across ranks.
UNCOMPARED_INPUT_DTYPES = frozenset({"scatter", "broadcast"})
UNCOMPARED_OUTPUT_DTYPES = frozenset({"gather"})


def op_type(op: str) -> str:
    """``"nccl:all_to_all_single"`` -> ``"all_to_all_single"`` (the backend prefix dropped)."""
    return op.rpartition(":")[2].strip()
