"""``python -m videoflow``: the videoflow command."""

from videoflow.cli import main

raise SystemExit(main())
