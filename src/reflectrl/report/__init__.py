"""Statistics, plots and the HTML/Markdown report of an experiment."""

# The default number of bootstrap resamples (numpy-free here, so the CLI can name it):
# enough that a verdict's CI endpoints stop moving.
BOOTSTRAP_REPS = 50_000
