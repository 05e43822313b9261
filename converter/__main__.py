"""The ``convert-model`` console script (also ``python -m converter``).

It imports nothing heavy before it can report Ctrl-C: the converter pulls in
libcst and every transform, which takes a good part of a second, and a
KeyboardInterrupt during those imports must end in one line, not a traceback.
"""

import sys


def main() -> int:
    try:
        from converter.cli import main as convert_model

        return convert_model()
    except KeyboardInterrupt:
        print("convert-model: interrupted", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
