"""The two ways a run stops on purpose.

`UserError` is bad input: the CLI prints its message as one line on stderr and exits 2,
with no traceback. Messages say what is wrong and how to fix it.

`NonFiniteError` is a training blow-up: the trainer stops before writing a checkpoint,
so the last good one is kept, and the message names the quantity that went non-finite.
"""

# Exit statuses of every command: bad input, a run that failed, Ctrl-C, SIGTERM.
EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class UserError(Exception):
    """Bad input from the user; `str(err)` is the one line shown."""


class NonFiniteError(Exception):
    """A loss, gradient or observation became NaN or infinite during training."""

    def __init__(self, quantity: str, global_step: int):
        self.quantity = quantity
        self.global_step = global_step
        super().__init__(
            f"non-finite {quantity} at global_step {global_step}; training stopped and the "
            "last good checkpoint was kept (try a lower learning_rate, or check the env's observations)"
        )
