/** XML well-formedness, enough to catch an unbalanced or unescaped SVG: tags nest and close, attributes are quoted. */
export const checkMarkup = (text: string): Array<string> => {
  const problems: Array<string> = []
  const stack: Array<string> = []
  const voids = new Set(["meta", "br", "hr", "img", "input", "link"])
  const tag =
    /<(\/?)([a-zA-Z][\w:-]*)((?:\s+[\w:-]+(?:="[^"<]*")?)*)\s*(\/?)>|<!doctype[^>]*>|<(?![/!a-zA-Z])/g
  for (let m = tag.exec(text); m !== null; m = tag.exec(text)) {
    if (m[0].startsWith("<!")) continue
    if (m[2] === undefined) {
      problems.push(`stray < at ${m.index}`)
      continue
    }
    const name = m[2].toLowerCase()
    if (m[1] === "/") {
      const open = stack.pop()
      if (open !== name) problems.push(`</${name}> closes <${open}> at ${m.index}`)
    } else if (m[4] !== "/" && !voids.has(name)) stack.push(name)
  }
  if (stack.length > 0) problems.push(`unclosed: ${stack.join(", ")}`)
  return problems
}
