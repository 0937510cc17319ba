"""Effect stages: a pure planner plus the model calls (judge, teacher) it asks for."""
