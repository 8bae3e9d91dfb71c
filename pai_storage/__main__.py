"""``python -m pai_storage``: the command line."""

from .cli import main

raise SystemExit(main())
