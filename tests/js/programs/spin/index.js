export async function main() { for (;;) {} }
