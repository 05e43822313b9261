"""The ``partition-model`` console script (also ``python -m partitioning``).

Like convert-model's, it imports nothing heavy before it can report Ctrl-C: the planner pulls in torch,
which takes about a second, and a KeyboardInterrupt during those imports must end in one line.
"""

import sys

from common.cli import main_of


def main() -> int:
    return main_of("partition-model", "partitioning.cli")


if __name__ == "__main__":
    sys.exit(main())
