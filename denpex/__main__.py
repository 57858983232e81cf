"""``python -m denpex``: the same as the ``denpex`` console script."""

from denpex.cli import main

main()
