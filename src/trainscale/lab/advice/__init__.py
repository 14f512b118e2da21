"""What the doctor tells the user to change: each cause's advice (``suggest``) in trainscale's flags for a job of
the run API, or in the script's own code and framework for a script instrumented from outside (``script``), and
the costs of the job's own setup that the doctor saw (``setup``)."""
