"""The problem formats the verifier judges: problem rows, code ground truths,
LiveCodeBench's rows and generations files."""
