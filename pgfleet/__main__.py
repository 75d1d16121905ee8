"""``python -m pgfleet`` and the ``pgfleet`` console script."""

from pgfleet.cli import main

if __name__ == "__main__":
    main()
