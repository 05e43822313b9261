"""The ``train-model`` console script (also ``python -m partitioning.train``): Ctrl-C during imports is one line."""

import sys

from common.cli import main_of


def main() -> int:
    return main_of("train-model", "partitioning.train.cli")


if __name__ == "__main__":
    sys.exit(main())
