"""What sits on top of everything: the end-to-end demo (`run`), the twin-to-service feed the demo and
tests use (`feed`), and the recipe of the small model they train (`model`)."""
