"""pi2.cli — the `pi2` command line: the Typer app (app.py) and what each command prints where (commands.py)."""
