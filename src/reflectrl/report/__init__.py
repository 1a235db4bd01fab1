"""Statistics, plots and the HTML/Markdown report of an experiment."""
