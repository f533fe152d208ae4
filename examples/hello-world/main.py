async def main(input: dict) -> str:
    name = input.get("name", "world")
    return f"hello {name}"
