"""``python -m lakehouse_assets.cli``: the ``lakehouse`` command."""

from lakehouse_assets.cli import main

if __name__ == "__main__":
    main()
