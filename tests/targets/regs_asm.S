/* regs_asm.S: the caller and callee of tests/targets/regs.c, in assembly
 * so that every register is under the test's control.
 *
 * call_checked(block) loads distinct values into every general register
 * (rax..r15 but rsp), sets the arithmetic flags (DF stays clear, as the
 * ABI requires at a call), fills its own frame above the call's return
 * address with known words and calls checked(), which compares all of it
 * with what the block says, before it touches any of it. After the return
 * call_checked checks the return value, the callee-saved registers and
 * rsp. Every mismatch is counted and its bit set in the block's mask.
 *
 * Block layout (u64 words), shared with regs.c:
 *   0..14  expected rax rbx rcx rdx rsi rdi rbp r8 r9 r10 r11 r12 r13 r14 r15
 *   15     expected rsp at checked's entry (the return address's slot)
 *   16     expected flags (already masked with FLAGS_MASK)
 *   17     the value checked returns
 *   18     calls of checked
 *   19     mismatches seen inside checked
 *   20     mismatches seen after the return
 *   21..29 the caller's frame above the return address (9 words; 21 and
 *          29 are the block's own address)
 *   30     mask of the failed checks: bit i < 15 register i, 15 rsp,
 *          16 flags, 17 + j frame word j, 32 + i register i after the
 *          return, 47 rsp after the return, 48 the return value
 */
        .intel_syntax noprefix
        .set FLAGS_MASK, 0xcd5          /* OF DF SF ZF AF PF CF */
        .set B_RSP, 15 * 8
        .set B_FLAGS, 16 * 8
        .set B_RET, 17 * 8
        .set B_CALLS, 18 * 8
        .set B_MIS, 19 * 8
        .set B_POST, 20 * 8
        .set B_FRAME, 21 * 8
        .set B_MASK, 30 * 8

        .text

/* One failed check inside checked: rax = block. */
        .macro miss bit
        inc qword ptr [rax + B_MIS]
        bts qword ptr [rax + B_MASK], \bit
        .endm

/* cmp REG with word i of the block (rax = block). */
        .macro check reg, i
        cmp \reg, qword ptr [rax + 8 * \i]
        je 1f
        miss \i
1:
        .endm

        .globl checked
        .type checked, @function
        .p2align 4
checked:
        pushfq
        push rax
        mov rax, qword ptr [rsp + 24]   /* frame word 0: the block */
        check rbx, 1
        check rcx, 2
        check rdx, 3
        check rsi, 4
        check rdi, 5
        check rbp, 6
        check r8, 7
        check r9, 8
        check r10, 9
        check r11, 10
        check r12, 11
        check r13, 12
        check r14, 13
        check r15, 14
        /* [rsp] rbx, [rsp+8] rax, [rsp+16] flags, [rsp+24] RA */
        push rbx
        mov rbx, qword ptr [rsp + 8]
        check rbx, 0
        lea rbx, [rsp + 24]
        check rbx, 15
        mov rbx, qword ptr [rsp + 16]
        and rbx, FLAGS_MASK
        check rbx, 16
        .irp j, 0, 1, 2, 3, 4, 5, 6, 7, 8
        mov rbx, qword ptr [rsp + 32 + 8 * \j]
        cmp rbx, qword ptr [rax + B_FRAME + 8 * \j]
        je 1f
        miss (17 + \j)
1:
        .endr
        inc qword ptr [rax + B_CALLS]
        pop rbx
        mov rax, qword ptr [rax + B_RET]
        add rsp, 16
        ret
        .size checked, . - checked

/* One failed check after the return: rdi = block. */
        .macro post_check reg, i, bit
        cmp \reg, qword ptr [rdi + 8 * \i]
        je 1f
        inc qword ptr [rdi + B_POST]
        bts qword ptr [rdi + B_MASK], \bit
1:
        .endm

/* void call_checked(uint64_t *block) */
        .globl call_checked
        .type call_checked, @function
        .p2align 4
call_checked:
        push rbx
        push rbp
        push r12
        push r13
        push r14
        push r15
        sub rsp, 72                     /* 16-byte aligned at the call */
        .irp j, 0, 1, 2, 3, 4, 5, 6, 7, 8
        mov rax, qword ptr [rdi + B_FRAME + 8 * \j]
        mov qword ptr [rsp + 8 * \j], rax
        .endr
        lea rax, [rsp - 8]
        mov qword ptr [rdi + B_RSP], rax
        push qword ptr [rdi + B_FLAGS]
        popfq
        mov rax, qword ptr [rdi + 0]
        mov rbx, qword ptr [rdi + 8]
        mov rcx, qword ptr [rdi + 16]
        mov rdx, qword ptr [rdi + 24]
        mov rsi, qword ptr [rdi + 32]
        mov rbp, qword ptr [rdi + 48]
        mov r8, qword ptr [rdi + 56]
        mov r9, qword ptr [rdi + 64]
        mov r10, qword ptr [rdi + 72]
        mov r11, qword ptr [rdi + 80]
        mov r12, qword ptr [rdi + 88]
        mov r13, qword ptr [rdi + 96]
        mov r14, qword ptr [rdi + 104]
        mov r15, qword ptr [rdi + 112]
        mov rdi, qword ptr [rdi + 40]
        call checked
        mov rdi, qword ptr [rsp + 64]   /* frame word 8: the block */
        post_check rax, 17, 48
        post_check rbx, 1, 33
        post_check rbp, 6, 38
        post_check r12, 11, 43
        post_check r13, 12, 44
        post_check r14, 13, 45
        post_check r15, 14, 46
        lea rax, [rsp - 8]
        post_check rax, 15, 47
        add rsp, 72
        pop r15
        pop r14
        pop r13
        pop r12
        pop rbp
        pop rbx
        ret
        .size call_checked, . - call_checked

        .section .note.GNU-stack, "", @progbits
