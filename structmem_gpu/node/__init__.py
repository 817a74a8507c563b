"""Node readiness: the models a job names, its preflight, the GPU memory plan, the dry run."""
