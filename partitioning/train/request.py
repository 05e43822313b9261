"""``train-model``'s request: its flags, a ``--config-file`` of them, and the settings a ``--resume`` must repeat.

The launcher (:mod:`partitioning.train.cli`) and each rank (:mod:`partitioning.train.rank`) parse the same
command line into a :class:`Request`; :func:`to_argv` writes it back for the ranks.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import tomllib

from common.cli import Parser, count, nonempty_path, positive_int, positive_number
from common.errors import UserError
from partitioning.gpu.autocast import DTYPES
from partitioning.plan import Plan
from partitioning.settings import TIED_SUMS
from partitioning.train.inputs import Sources
from partitioning.train.layout import SETTINGS
from partitioning.train.loss_scale import INITIAL
from partitioning.train.optim import DECAYS

PROG = "train-model"
SPAN = ("--steps", "--epochs")  # how long a run trains: one of them
RANK_MODULE = "partitioning.train.rank"


@dataclass(frozen=True)
class Request:
    plan: Path
    checkpoint: Path | None
    data: Path | None
    steps: int | None  # None: --epochs, which the launcher turns into the steps the ranks get
    save: Path | None
    save_every: int | None
    resume: Path | None
    lr: float
    weight_decay: float
    betas: tuple[float, float]
    eps: float
    warmup_steps: int
    decay: str
    decay_steps: int | None
    clip_grad: float | None
    micro_batches: int | None
    seed: int
    log_every: int
    data_parallel: int = 1
    tied_sum: str | None = None  # None: the plan's
    dtype: str = "fp32"
    nnodes: int = 1
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    models_dir: Path | None = None  # the generated code (default: the directory the plan records)
    decay_all_parameters: bool = False
    save_total_limit: int | None = None  # keep this many --save-every checkpoints, as checkpoint-<step>/
    tensorboard: Path | None = None  # also write the metrics as TensorBoard scalars here
    text: Path | None = None  # raw text for a causal LM
    tokenizer: Path | None = None
    config_from_checkpoint: bool = False  # config fields the plan has otherwise: the checkpoint's (with a warning)
    verbose: bool = False
    config_file: Path | None = None  # the settings it held are in the fields above (the ranks never read it)
    echo_settings: Path | None = None  # a rank's: the launcher's settings_text of the run, for the saves
    epochs: float | None = None  # instead of --steps: passes over the data
    eval_data: Path | None = None  # evaluated after the last step (and every eval_every steps)
    eval_every: int | None = None
    dataset: Path | None = None  # a datasets dataset (save_to_disk directory, parquet, JSON Lines, CSV)
    split: str | None = None
    eval_dataset: Path | None = None
    eval_split: str | None = None
    text_column: str | None = None
    text_pair_column: str | None = None
    target_column: str | None = None
    label_column: str | None = None
    loss_scale: float = INITIAL  # --dtype fp16's initial loss scale

    def sources(self) -> Sources:
        return Sources(**{field.name: getattr(self, field.name) for field in fields(Sources)})


def _betas(text: str) -> tuple[float, float]:
    try:
        first, second = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two numbers B1,B2, got {text!r}") from None
    if not (0 <= first < 1 and 0 <= second < 1):
        raise argparse.ArgumentTypeError(f"betas must lie in [0, 1), got {text!r}")
    return first, second


def _nonnegative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=nonempty_path, required=True, help="plan JSON written by partition-model")
    parser.add_argument("--checkpoint", type=nonempty_path, help="HF model directory to start from")
    parser.add_argument("--resume", type=nonempty_path, help="a directory --save wrote: continue that run")
    parser.add_argument("--data", type=nonempty_path, help="JSON Lines, one example per line")
    parser.add_argument("--text", type=nonempty_path,
                        help="instead of --data, for a causal LM: raw text, tokenized and packed into the plan's length")
    parser.add_argument("--dataset", type=nonempty_path, metavar="PATH",
                        help="a datasets dataset: a save_to_disk directory, or a .parquet, .jsonl, .csv file")
    parser.add_argument("--split", metavar="NAME", help="the --dataset directory's split to train (default train)")
    parser.add_argument("--tokenizer", type=nonempty_path, metavar="DIR",
                        help="DIR/tokenizer.json, what --text and --dataset's text are tokenized with (default: "
                             "the checkpoint's directory)")
    parser.add_argument("--text-column", metavar="NAME",
                        help="--dataset's text (default text; a token classifier's words: tokens)")
    parser.add_argument("--text-pair-column", metavar="NAME", help="--dataset's second text (sentence pairs)")
    parser.add_argument("--target-column", metavar="NAME", help="a seq2seq --dataset's target text (default target)")
    parser.add_argument("--label-column", metavar="NAME",
                        help="--dataset's labels (default label or labels; a token classifier's: ner_tags)")
    span = parser.add_mutually_exclusive_group(required=True)
    span.add_argument("--steps", type=positive_int, help="train until this step (in all)")
    span.add_argument("--epochs", type=positive_number, metavar="E",
                      help="instead of --steps: E passes over the data (E x examples / examples a step, rounded up: "
                           "the last step may take examples of the next pass)")
    parser.add_argument("--eval-data", type=nonempty_path, metavar="FILE",
                        help="JSON Lines as --data: its mean loss, forward only in eval mode, after the last step")
    parser.add_argument("--eval-dataset", type=nonempty_path, metavar="PATH",
                        help="evaluate a datasets dataset, as --dataset reads it (its split: --eval-split)")
    parser.add_argument("--eval-split", metavar="NAME",
                        help="evaluate this split (of --eval-dataset, else of --dataset; default validation)")
    parser.add_argument("--eval-every", type=positive_int, metavar="N", help="evaluate also every N steps")
    parser.add_argument("--save", type=nonempty_path, help="write the checkpoint here (a HF model directory)")
    parser.add_argument("--save-every", type=positive_int, help="also save every N steps (default: at the end)")
    parser.add_argument("--save-total-limit", type=positive_int, metavar="K",
                        help="with --save-every: each of those saves into DIR/checkpoint-<step>/, the newest K kept "
                             "(the last save goes to DIR)")
    parser.add_argument("--lr", type=positive_number, default=5e-5, help="AdamW learning rate (default 5e-5)")
    parser.add_argument("--weight-decay", type=_nonnegative, default=0.0,
                        help="AdamW's decoupled weight decay (default 0), as HF Trainer: none on biases and norm "
                             "weights")
    parser.add_argument("--decay-all-parameters", action="store_true",
                        help="weight decay on every parameter, biases and norms included (one AdamW group)")
    parser.add_argument("--betas", type=_betas, default=(0.9, 0.999), help="B1,B2 (default 0.9,0.999)")
    parser.add_argument("--eps", type=positive_number, default=1e-8)
    parser.add_argument("--warmup-steps", type=count, default=0, help="linear warm-up from 0 (default 0)")
    parser.add_argument("--decay", choices=DECAYS, default="linear", help="after warm-up, to 0 at --decay-steps")
    parser.add_argument("--decay-steps", type=positive_int, help="the steps the schedule spans (default: --steps)")
    parser.add_argument("--clip-grad", type=positive_number, help="clip the global gradient norm to this")
    parser.add_argument("--micro-batches", type=positive_int, help="default: the plan's")
    parser.add_argument("--seed", type=int, default=0, help="the data order (and each rank's RNG)")
    parser.add_argument("--log-every", type=positive_int, default=1,
                        help="print and record every N steps (in --save DIR/metrics.jsonl) (default 1)")
    parser.add_argument("--tensorboard", type=nonempty_path, metavar="DIR",
                        help="also write the metrics as TensorBoard scalars under DIR (needs tensorboard)")
    parser.add_argument("--data-parallel", type=positive_int, default=1,
                        help="D replicas of the pipeline (stages x D ranks), gradients averaged (default 1)")
    parser.add_argument("--tied-sum", choices=TIED_SUMS,
                        help="a weight several stages hold: 'ordered' sums its gradients in one process's order "
                             "(bit for bit; keeps each micro-batch's gradient of it until the step ends), "
                             "'allreduce' adds each holder's accumulated gradient once a step (no extra memory; "
                             "equal up to float addition order) (default: the plan's, partition-model --tied-sum)")
    parser.add_argument("--dtype", choices=DTYPES, default="fp32",
                        help="bf16, fp16: each stage's forward under torch.autocast on its device, the "
                             "weights, gradients and AdamW state fp32; fp16 with a loss scale (default fp32)")
    parser.add_argument("--loss-scale", type=positive_number, default=INITIAL, metavar="S",
                        help=f"--dtype fp16's initial loss scale (default {INITIAL:g}, torch's GradScaler's): "
                             f"halved at each overflow, which skips its step, doubled after 2000 clean steps")
    parser.add_argument("--nnodes", type=positive_int, default=1,
                        help="machines sharing the ranks; without --node-rank: print each machine's command")
    parser.add_argument("--node-rank", type=count, help="this machine's index (with --nnodes, --rdzv-endpoint)")
    parser.add_argument("--rdzv-endpoint", type=_endpoint, help="HOST:PORT of node 0 (the rendezvous)")
    parser.add_argument("--models-dir", type=nonempty_path, metavar="DIR",
                        help="import the generated code from DIR (default: the directory the plan records)")
    parser.add_argument("--config-from-checkpoint", action="store_true",
                        help="where the checkpoint's config differs from the plan's in a field other than a size "
                             "(dropout, eps, rope, activation, token ids): train the checkpoint's value, with a "
                             "warning naming each field (default: refuse)")
    parser.add_argument("-v", "--verbose", action="store_true")
    # the launcher's --config-file form of the run as the user gave it (a rank's own request may hold the data
    # file --text was packed into), which the saves hold as DIR/train_config.toml
    parser.add_argument("--echo-settings", type=nonempty_path, help=argparse.SUPPRESS)
    parser.add_argument("--config-file", type=nonempty_path, metavar="TOML",
                        help="settings as a TOML file, one per flag (lr = 1e-4, betas = [0.9, 0.99], "
                             "decay-all-parameters = true); the command line overrides them. Each save holds the "
                             f"run's settings as DIR/{SETTINGS}, a file of this form")
    return parser


def settings_argv(path: Path) -> list[str]:
    """The command line ``--config-file path`` stands for: each key a flag, its value the flag's (a list joined
    with commas, ``true`` the flag alone, ``false`` nothing)."""
    try:
        settings = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"--config-file {path}: {' '.join(str(exc).split())[:200]}") from None
    known = {field.name: field for field in fields(Request)}
    argv = []
    for key, value in settings.items():
        name, flag = key.replace("-", "_"), "--" + key.replace("_", "-")
        if name not in known or name in ("config_file", "echo_settings"):
            raise UserError(f"--config-file {path}: unknown setting {key!r} ({PROG} has no {flag})")
        switch = known[name].type == "bool"
        if isinstance(value, bool) != switch or isinstance(value, dict):
            raise UserError(f"--config-file {path}: {key} = {value!r}: expected "
                            f"{'true or false' if switch else 'a value (a number, a string or a list)'}")
        if switch:
            argv += [flag] if value else []
        else:
            argv += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return argv


def settings_text(request: Request) -> str:
    """``request`` as a --config-file: every setting it has, one line each, in the flags' order."""
    lines = []
    for key, value in vars(request).items():
        if value is None or key in ("config_file", "echo_settings"):
            continue
        if isinstance(value, bool):
            shown = "true" if value else "false"
        elif isinstance(value, (int, float)):
            shown = repr(value)
        elif isinstance(value, tuple):
            shown = "[" + ", ".join(repr(v) for v in value) + "]"
        else:
            shown = json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's
        lines.append(f"{key.replace('_', '-')} = {shown}")
    return f"# {PROG}'s settings of this run: {PROG} --config-file {SETTINGS} runs it again\n" + "\n".join(lines) + "\n"


def _endpoint(text: str) -> str:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return text


def parse(argv: list[str] | None) -> Request:
    given = list(sys.argv[1:] if argv is None else argv)
    first = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    first.add_argument("--config-file", type=nonempty_path)
    found, _ = first.parse_known_args(given)
    stored = settings_argv(found.config_file) if found.config_file else []
    if any(part.split("=")[0] in SPAN for part in given):  # the command line's span replaces the file's
        stored = [part for index, part in enumerate(stored)
                  if part not in SPAN and (index == 0 or stored[index - 1] not in SPAN)]
    args = parser().parse_args([*stored, *given])
    if (args.checkpoint is None) == (args.resume is None):
        raise UserError("give --checkpoint DIR (start from a model) or --resume DIR (continue a run), one of them")
    if [args.data, args.text, args.dataset].count(None) != 2:
        raise UserError("give --data FILE (JSON Lines), --text FILE (raw text) or --dataset PATH, "
                        "one of them")
    if args.tokenizer is not None and args.text is None and args.dataset is None and args.eval_dataset is None:
        raise UserError("--tokenizer DIR tokenizes --text or --dataset: give one")
    if args.split is not None and args.dataset is None:
        raise UserError("--split NAME is a split of --dataset PATH: give it")
    columns = [flag for flag in ("text_column", "text_pair_column", "target_column", "label_column")
               if getattr(args, flag) is not None]
    if columns and args.dataset is None and args.eval_dataset is None:
        raise UserError(f"--{columns[0].replace('_', '-')} names a column of --dataset PATH: give it")
    evaluated = args.eval_data is not None or args.eval_dataset is not None or args.eval_split is not None
    if args.eval_split is not None and args.dataset is None and args.eval_dataset is None:
        raise UserError("--eval-split NAME is a split of --dataset PATH or --eval-dataset PATH: give one")
    if args.eval_data is not None and (args.eval_dataset is not None or args.eval_split is not None):
        raise UserError("give --eval-data FILE or --eval-dataset/--eval-split, one of them")
    if args.eval_every is not None and not evaluated:
        raise UserError("--eval-every N evaluates --eval-data FILE, --eval-dataset PATH or --eval-split NAME: give one")
    if args.loss_scale != INITIAL and args.dtype != "fp16":
        raise UserError("--loss-scale S scales the loss of --dtype fp16: give it")
    if args.save_every is not None and args.save is None:
        raise UserError("--save-every needs --save DIR")
    if args.save_total_limit is not None and args.save_every is None:
        raise UserError("--save-total-limit K keeps the newest K of the --save-every checkpoints: give --save-every N")
    if args.tensorboard is not None and importlib.util.find_spec("tensorboard") is None:
        raise UserError("--tensorboard DIR needs the tensorboard package (torch's SummaryWriter writes through it): "
                        "pip install tensorboard")
    if args.nnodes == 1 and (args.node_rank is not None or args.rdzv_endpoint is not None):
        raise UserError("--node-rank and --rdzv-endpoint are for --nnodes N > 1")
    if args.node_rank is not None and (args.rdzv_endpoint is None or args.node_rank >= args.nnodes):
        raise UserError(f"--node-rank needs --rdzv-endpoint HOST:PORT and must be below --nnodes {args.nnodes}")
    return Request(**vars(args))


# What a resumed run keeps of the run it continues, each with the flags that set it.
_KEPT = {"seed": "--seed", "micro_batches": "--micro-batches", "lr": "--lr", "weight_decay": "--weight-decay",
         "decay_all_parameters": "--decay-all-parameters",
         "betas": "--betas", "eps": "--eps", "warmup_steps": "--warmup-steps", "decay": "--decay",
         "schedule_steps": "--decay-steps (else --steps)", "stage_starts": "the plan's cuts",
         "placement": "the plan's placement"}


def kept_settings(request: Request, plan: Plan, micro_batches: int) -> dict[str, Any]:
    """The settings of a run that a ``--resume`` of its save must repeat (saved in train_state.json), as JSON
    holds them: the data order, the optimizer and its schedule (their state is restored as saved), the stages."""
    settings = {"seed": request.seed, "micro_batches": micro_batches, "lr": request.lr,
                "weight_decay": request.weight_decay, "decay_all_parameters": request.decay_all_parameters,
                "betas": list(request.betas), "eps": request.eps,
                "warmup_steps": request.warmup_steps, "decay": request.decay,
                "schedule_steps": request.decay_steps or request.steps,
                "stage_starts": [stage.blocks[0] for stage in plan.stages], "placement": plan.ranks}
    return json.loads(json.dumps(settings))


def check_resumed(request: Request, state: dict[str, Any], kept: dict[str, Any]) -> None:
    """A resumed run continues the saved one exactly; a setting given otherwise would be ignored (the optimizer's
    and schedule's state are restored as saved) or would change the run silently (the data order, the schedule's
    span), so each is refused.  A save written before these were recorded is compared on its stages alone."""
    for key, flag in _KEPT.items():
        if key in state and state[key] != kept[key]:
            raise UserError(f"--resume {request.resume} continues a run of {flag} {_shown(state[key])}; this one "
                            f"has {_shown(kept[key])}: a resumed run keeps the saved run's settings (give them, or "
                            f"start a new run from its weights with --checkpoint {request.resume})")


def _shown(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def to_argv(request: Request) -> list[str]:
    """The command line that makes ``request`` again (what each rank parses)."""
    argv = []
    defaults = {"verbose": False, "data_parallel": 1, "nnodes": 1, "dtype": "fp32", "loss_scale": INITIAL}
    for key, value in vars(request).items():
        if value is None or defaults.get(key) == value or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif isinstance(value, tuple):
            argv += [flag, ",".join(repr(v) for v in value)]
        else:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    return argv


