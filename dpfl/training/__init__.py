"""Local training and evaluation of a cohort of clients, vectorized: what a simulated cohort and a
deployed site run alike (`trainer.Trainer`, `cohort.CohortModel`, `evaluate`)."""
