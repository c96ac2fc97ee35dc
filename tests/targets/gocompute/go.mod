module weft.test/gocompute

go 1.19
