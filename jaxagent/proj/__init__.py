"""Recipe-private parts (big_vision's `proj/`): what one paper needs and no other recipe shares."""
