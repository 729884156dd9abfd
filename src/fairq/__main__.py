"""``python -m fairq`` runs the command line (same as the ``fairq`` script)."""

from .cli import main

main()
