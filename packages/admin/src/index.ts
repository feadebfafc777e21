export * as Admin from "./Admin"
export * as AdminHttp from "./AdminHttp"
export * as AdminNodes from "./AdminNodes"
export * as BillingAdmin from "./BillingAdmin"
