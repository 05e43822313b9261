"""The ``convert-model`` console script (also ``python -m converter``).

It imports nothing heavy before it can report Ctrl-C: the converter pulls in
libcst and every transform, which takes a good part of a second, and a
KeyboardInterrupt during those imports must end in one line, not a traceback.
"""

import sys

from common.cli import main_of


def main() -> int:
    return main_of("convert-model", "converter.cli")


if __name__ == "__main__":
    sys.exit(main())
