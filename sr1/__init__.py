"""sr1: the command (`sr1 run`, `sr1 generators`, ...), the launchers and the embedded tiny world."""
