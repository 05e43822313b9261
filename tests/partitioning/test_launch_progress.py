"""The launcher's relayed lines: one progress bar of the step lines on a terminal, every line as it came elsewhere."""

from __future__ import annotations

import io

from partitioning.gpu.launch import Progress

LINES = ["loaded stage 0's 12 tensors in 0.1 s; step 3 starts on 2 ranks",
         "step 3/5: loss 2.5000, 100 tokens/s, lr 0.001, 3 s to go",
         "step 4/5: loss 2.2500, 110 tokens/s, lr 0.0005, 2 s to go",
         "saved step 4 to out/checkpoint-4 in 0.1 s",
         "step 5/5: loss 2.1250, 120 tokens/s, lr 0"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def relay(stream: io.StringIO) -> str:
    progress = Progress(stream)
    for line in LINES:
        progress.line(line)
    progress.close()
    return stream.getvalue()


def test_a_terminal_sees_one_bar_and_the_other_lines_above_it() -> None:
    shown = relay(Terminal())
    frames = shown.replace("\r", "\n").splitlines()
    assert any("2/5" in frame for frame in frames), shown  # a resumed run's bar starts at its step
    last = [frame for frame in frames if "5/5" in frame]
    assert last and "loss 2.1250, lr 0" in last[-1] and "to go" not in last[-1], shown  # the bar's own ETA instead
    assert LINES[0] in frames and LINES[3] in frames, shown
    assert not any(frame.startswith("step ") for frame in frames), shown


def test_a_file_or_pipe_gets_every_line_as_it_came() -> None:
    assert relay(io.StringIO()) == "".join(line + "\n" for line in LINES)
