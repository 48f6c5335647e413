"""The training side of hpcdp: `python -m train`, one GPT-2 pre-training loop for six strategies.

Importing this package is cheap; torch and transformers load only in the modules that need them
(train.loop, train.model, ...), so `python -m train --help` answers at once.
"""
