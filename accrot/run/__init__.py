"""The Lightning run: ``accrot fit|validate|test`` (LightningCLI with accrot's run layout, resumable, checked), the
commands that read a finished run (``eval``, ``diagnose``), and the checks of a launch."""
