// The host imports as componentize-qjs binds them: `import iface from "pie:inferlet/<iface>@0.1.0"`,
// kebab-case functions in camelCase, `result<T, error>` returning T or throwing the error record,
// `option<T>` as T | null, u64 call numbers as numbers. Only poll is typed here; see README.
declare module 'pie:inferlet/poll@0.1.0' {
  const poll: { wait(calls: number[], timeoutMs: number | null): number[]; cancel(call: number): void };
  export default poll;
}
declare module 'pie:inferlet/*' {
  const iface: any;
  export default iface;
}
