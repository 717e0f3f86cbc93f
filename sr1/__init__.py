"""sr1: the command line (`sr1 run`, `sr1 generators`, ...), the launchers and the run reports."""
