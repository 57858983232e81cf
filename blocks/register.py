"""Register Denpex's block types and the local defaults: ``denpex register-blocks``.

Defaults: the ``default`` runbook block (``hang-triage``) and, when a folder or S3 bucket is
given, the ``default`` evidence store. Existing documents are kept unless ``overwrite``.
"""

from __future__ import annotations

import argparse

from prefect.blocks.core import Block

from blocks import all_block_types
from blocks.evidence import DenpexEvidenceStore
from blocks.runbook import DenpexRunbook
from blocks.runbook import DEFAULT_RUNBOOK

__all__ = ["register_block_types", "create_local_defaults", "main", "register"]


def register_block_types() -> list[str]:
    """Register every Denpex block type with the Prefect API; return their slugs."""
    kinds: tuple[type[Block], ...] = all_block_types()
    for kind in kinds:
        kind.register_type_and_schema()
    return [kind.get_block_type_slug() for kind in kinds]


def _save(block: Block, name: str, overwrite: bool) -> bool:
    try:
        block.save(name, overwrite=overwrite)
    except ValueError:  # it exists and overwrite is off
        return False
    return True


def create_local_defaults(*, runbook: str = DEFAULT_RUNBOOK, evidence_folder: str | None = None,
                          overwrite: bool = False) -> list[str]:
    """Create the default documents; return the ones written."""
    made = []
    if _save(DenpexRunbook(name=runbook), "default", overwrite):
        made.append("denpex-runbook/default")
    if evidence_folder and _save(DenpexEvidenceStore(folder=evidence_folder), "default", overwrite):
        made.append("denpex-evidence-store/default")
    return made


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="denpex register-blocks", description=__doc__)
    parser.add_argument("--runbook", default=DEFAULT_RUNBOOK, help="runbook name for the default runbook block")
    parser.add_argument("--evidence-folder", help="folder for the default evidence store block")
    parser.add_argument("--overwrite", action="store_true", help="replace existing default documents")
    args = parser.parse_args(argv)
    register(runbook=args.runbook, evidence_folder=args.evidence_folder, overwrite=args.overwrite)


def register(*, runbook: str = DEFAULT_RUNBOOK, evidence_folder: str | None = None, overwrite: bool = False) -> None:
    """Register the block types and create the local defaults; say what was made."""
    types = register_block_types()
    made = create_local_defaults(runbook=runbook, evidence_folder=evidence_folder, overwrite=overwrite)
    print(f"registered block types: {', '.join(types)}")
    print(f"created: {', '.join(made) or 'nothing (defaults exist; --overwrite replaces them)'}")


if __name__ == "__main__":
    main()
