"""The IPU target: place a pipeline plan on Graphcore IPUs with PopTorch annotations and options.

Planning, validation, code generation and the options file need only this
package; annotating a live model needs ``poptorch``, which ships only with
Graphcore's Poplar SDK and is imported lazily.
"""
