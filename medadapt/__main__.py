"""``python -m medadapt`` is the same as the ``medadapt`` command."""

from medadapt.cli import main

if __name__ == "__main__":
    main()
