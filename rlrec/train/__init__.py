"""The training loop and what it owns: the runner (``runner``), the eval loop (``evaluation``), the
env stacks (``stack``), checkpoint files (``checkpoint``) and the metrics (``logger``)."""
