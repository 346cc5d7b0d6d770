"""`python -m pi2` — the same as the `pi2` console script."""
from pi2.cli import main

main()
