// Placeholder: filled in by the train module work (issue 5).
