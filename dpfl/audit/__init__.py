"""Privacy audits: canaries through the real training code, and ε lower bounds from guessing them
(Steinke, Nasr & Jagielski 2023; Andrew et al. 2024). See docs/audit.md."""
