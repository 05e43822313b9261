"""Train a plan's stages from a stock checkpoint on one's own data (``train-model``), and the API behind it.

``stage`` (this rank's stage, loaded alone from the checkpoint), ``checkpoint``
(a HF model directory read key by key), ``model`` (the model on ``meta`` and its
stock keys), ``data`` (JSON Lines examples), ``optim`` (AdamW and the schedule),
``save`` (checkpoint and training state, all or nothing), ``rank`` (one rank's
loop), ``cli`` (the command).  See docs/train-model.md.
"""
