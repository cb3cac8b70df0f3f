"""Draft trees: shapes built by pure functions over marginals, proposals from each drafter, the
tree verdict, the tree cycle and tree sizing. Imports the sub-packages below it."""
