"""The field's small-model length-generalisation protocols on accrot's cells (``accrot yardstick``): the formal
languages of the Chomsky-hierarchy suite as the state-tracking literature trains them (parity, modular arithmetic
with and without brackets; lengths 3–40, tested to 256) and flip-flop language modelling, each table beside the
published rows and the predictions the cells' algebra makes.

``cells`` (the schemes and the running state each can carry) < ``protocols`` (data, shape, budget, scoring,
published rows, predictions) < ``runner`` (one run in-process, the order of the runs) < ``report`` < ``command``.
"""
