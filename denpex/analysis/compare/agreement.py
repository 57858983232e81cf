"""What the members of one collective must share, read from the op tables in
:mod:`denpex.analysis.op_rules` (the module docstring there says why per op).

    >>> root = OpSignature(op="gloo:gather", input_sizes=((4,),), input_dtypes=("Float",),
    ...                    output_sizes=((4,),) * 4, output_dtypes=("Float",) * 4)
    >>> leaf = OpSignature(op="gloo:gather", input_sizes=((4,),), input_dtypes=("Float",))
    >>> agreement_key(root) == agreement_key(leaf)
    True
"""

from __future__ import annotations

from denpex.analysis.op_rules import (
    ROOT_ONLY_INPUT,
    ROOT_ONLY_OUTPUT,
    UNCOMPARED_INPUT_DTYPES,
    UNCOMPARED_OUTPUT_DTYPES,
    VARIABLE_INPUT_SIZES,
    VARIABLE_OUTPUT_SIZES,
    op_type,
)
from denpex.analysis.summary import OpSignature

__all__ = ["AgreementKey", "agreement_key"]

AgreementKey = tuple[object, ...]


def agreement_key(signature: OpSignature) -> AgreementKey:
    """The part of ``signature`` that every member's call must share; equal keys agree."""
    kind = op_type(signature.op)
    in_sizes = None if kind in VARIABLE_INPUT_SIZES else signature.input_sizes
    out_sizes = None if kind in VARIABLE_OUTPUT_SIZES else signature.output_sizes
    in_dtypes = None if kind in UNCOMPARED_INPUT_DTYPES or (
        kind in ROOT_ONLY_INPUT) else frozenset(signature.input_dtypes) or None
    out_dtypes = None if kind in UNCOMPARED_OUTPUT_DTYPES or (
        kind in ROOT_ONLY_OUTPUT) else frozenset(signature.output_dtypes) or None
    # A rank with no tensors on one side (an empty all_to_all split list) states no dtype there;
    # mixing the sides keeps the op's element type comparable across such ranks.
    if kind in VARIABLE_INPUT_SIZES and kind in VARIABLE_OUTPUT_SIZES:
        in_dtypes = frozenset(signature.input_dtypes) | frozenset(signature.output_dtypes) or None
        out_dtypes = None
    return (signature.op, in_sizes, in_dtypes, out_sizes, out_dtypes)
