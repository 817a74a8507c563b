"""Answer and judge prompt texts shared by every method (paper and official protocols)."""
