package main

// A Line is one line of a merged template and the combinations whose
// rendering has it.
type Line struct {
	Text string
	In   Set
}

// A Variant is one rendering of an object and the combinations that
// render it so.
type Variant struct {
	Lines []string
	In    Set
}

// Merge interleaves the variants' lines into one sequence in which each
// variant's lines are, in order, exactly the lines whose set holds its
// combinations: the variants are merged one after another along their
// longest common subsequence with what is merged so far, a line common to
// both getting the union of their sets.
func Merge(variants []Variant) []Line {
	var merged []Line
	for _, v := range variants {
		merged = mergeOne(merged, v)
	}
	return merged
}

func mergeOne(merged []Line, v Variant) []Line {
	n, m := len(merged), len(v.Lines)
	// lcs[i][j]: the longest common subsequence of merged[i:] and
	// v.Lines[j:], in one slice.
	w := m + 1
	lcs := make([]int32, (n+1)*w)
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			switch {
			case merged[i].Text == v.Lines[j]:
				lcs[i*w+j] = lcs[(i+1)*w+j+1] + 1
			case lcs[(i+1)*w+j] >= lcs[i*w+j+1]:
				lcs[i*w+j] = lcs[(i+1)*w+j]
			default:
				lcs[i*w+j] = lcs[i*w+j+1]
			}
		}
	}
	out := make([]Line, 0, n+m)
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && merged[i].Text == v.Lines[j]:
			out = append(out, Line{Text: merged[i].Text, In: merged[i].In.Union(v.In)})
			i++
			j++
		case j == m || (i < n && lcs[(i+1)*w+j] >= lcs[i*w+j+1]):
			out = append(out, merged[i])
			i++
		default:
			out = append(out, Line{Text: v.Lines[j], In: v.In})
			j++
		}
	}
	return out
}

// Select returns the lines of merged whose set holds combination i: the
// rendering of the variant that holds it.
func Select(merged []Line, i int) []string {
	var out []string
	for _, l := range merged {
		if l.In[i] {
			out = append(out, l.Text)
		}
	}
	return out
}
