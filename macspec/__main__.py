"""`python -m macspec`: the same as the `macspec` command (and what `mlx.launch` runs)."""

import sys

from macspec.cli import main

sys.exit(main())
