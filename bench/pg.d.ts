// The few parts of `pg` (a dependency of @effect/sql-pg) the bench uses to make and drop its database.
declare module "pg" {
  export class Client {
    constructor(options: { readonly connectionString: string })
    connect(): Promise<void>
    query(text: string): Promise<unknown>
    end(): Promise<void>
  }
  const pg: { readonly Client: typeof Client }
  export default pg
}
