export default ["packages/*", "apps/*"]
