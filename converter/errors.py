class ConvertError(Exception):
    """A user-facing failure: printed as one line, exit code 2."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def one_line(self) -> str:
        text = str(self).replace("\n", " ")
        return f"{text} (hint: {self.hint})" if self.hint else text


class Interrupted(BaseException):
    """SIGTERM or SIGHUP, raised so that every ``with``/``finally`` cleans up (like KeyboardInterrupt)."""
