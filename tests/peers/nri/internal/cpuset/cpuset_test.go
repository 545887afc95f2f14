package cpuset

import "testing"

func TestRoundTrip(t *testing.T) {
	for in, want := range map[string]string{
		"": "", "0": "0", "0-3": "0-3", "3,1,2": "1-3", "0-1,4,6-7": "0-1,4,6-7", "5-5": "5",
	} {
		s, err := Parse(in)
		if err != nil {
			t.Fatalf("Parse(%q): %v", in, err)
		}
		if got := s.String(); got != want {
			t.Errorf("Parse(%q).String() = %q, want %q", in, got, want)
		}
	}
}

func TestInvalid(t *testing.T) {
	for _, in := range []string{"a", "1-", "-1", "3-1", "01", "1,,2", "+1"} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) accepted", in)
		}
	}
}

func TestMinus(t *testing.T) {
	a, _ := Parse("0-7")
	b, _ := Parse("2-3,6")
	if got := a.Minus(b).String(); got != "0-1,4-5,7" {
		t.Errorf("got %q", got)
	}
}
